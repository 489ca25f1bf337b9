"""Read mpi_dp result files (HDF5) lazily, including files another process is still writing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpi_dp import strict_json
from mpi_dp.errors import MpiDpError, ResultError
from mpi_dp.results.output import partial_path, progress_text, writer_gone
from mpi_dp.results.recorder import ARRAYS

if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # pragma: no cover - Python 3.10: the same parser as tomli
    import tomli as _toml

FORMAT = "mpi_dp.results"
FORMAT_VERSION = 2  # 2: named dimensions, per-agent values as datasets (1 still read)


class ResultFileError(MpiDpError, ValueError):
    """A file that is not a readable mpi_dp result file; the message names the file."""


class ResultNotFoundError(MpiDpError, FileNotFoundError):
    """A result file that does not exist; the message names the file."""


def _text(value: Any) -> str:
    """Decode an HDF5 string attribute (str, bytes or 0-d array) to str."""
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8", "replace")
    return str(value)


def _attr_value(value: Any) -> Any:
    """Convert an HDF5 attribute to a plain Python / NumPy value."""
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def _open_h5(path: Path) -> h5py.File:
    """Open read-only without file locking, so a file still being written can be read."""
    try:
        return h5py.File(path, "r", locking=False)
    except TypeError:  # pragma: no cover - old h5py without the locking keyword
        return h5py.File(path, "r")


class ConfigView:
    """One configuration of a result file; datasets are read on demand."""

    def __init__(self, group: h5py.Group, index: int, path: Path) -> None:
        self._g = group
        self._path = path
        self.attrs: dict[str, Any] = {k: _attr_value(v) for k, v in group.attrs.items()}
        arrays = group.get(ARRAYS)  # attributes too long for one (mpi_dp.results.recorder)
        if isinstance(arrays, h5py.Group):
            self.attrs.update((k, ds[()]) for k, ds in arrays.items())
        for k, ds in group.items():  # format 2: per-agent values on `agent`, the run ids on `run`
            if isinstance(ds, h5py.Dataset):
                if ds.attrs.get("per_agent", False):
                    self.attrs[k] = ds[()]
                elif k == "run" and "run_ids" not in self.attrs:
                    self.attrs["run_ids"] = ds[()]
        self.index: int = int(self.attrs.get("config_index", index))
        self.eps: np.ndarray = np.atleast_1d(np.asarray(self.attrs.get("eps", []), dtype=float))
        self.n: np.ndarray = np.atleast_1d(np.asarray(self.attrs.get("n", []), dtype=np.int64))
        label = self.attrs.get("label")
        self.label: str = _text(label) if label is not None else f"config {self.index}"

    def __repr__(self) -> str:
        return f"ConfigView(index={self.index}, label={self.label!r})"

    @property
    def group(self) -> h5py.Group:
        """The underlying HDF5 group."""
        return self._g

    @property
    def runs(self) -> int:
        """Number of Monte-Carlo runs (from the attribute, else the metric width)."""
        if "runs" in self.attrs:
            return int(self.attrs["runs"])
        names = self.metric_names()
        return int(self._g["metrics"][names[0]].shape[1]) if names else 0

    def _metrics(self) -> h5py.Group | None:
        m = self._g.get("metrics")
        return m if isinstance(m, h5py.Group) else None

    def metric_names(self) -> list[str]:
        """Names of the per-run (2-D) metric datasets."""
        m = self._metrics()
        if m is None:
            return []
        return sorted(k for k, d in m.items() if isinstance(d, h5py.Dataset) and d.ndim == 2)

    def n_records(self) -> int:
        """Records present in every metric dataset (a file being written may be ragged)."""
        m = self._metrics()
        if m is None or "iteration" not in m:
            return 0
        lengths = [m["iteration"].shape[0]]
        lengths += [m[k].shape[0] for k in self.metric_names()]
        return int(min(lengths))

    def iterations(self) -> np.ndarray:
        """Iteration k of each record, int64 (records,)."""
        m = self._metrics()
        if m is None or "iteration" not in m:
            return np.zeros(0, dtype=np.int64)
        return np.asarray(m["iteration"][: self.n_records()], dtype=np.int64)

    def metric(self, name: str) -> np.ndarray:
        """Per-run metric `name` as float64 (records, runs)."""
        m = self._metrics()
        if m is None or name not in m:
            left_out = self.attrs.get("not_recorded")
            raise ResultError(
                f"{self._path}: configuration {self.index} has no metric {name!r}; "
                f"available: {', '.join(self.metric_names()) or 'none'}"
                + ("" if self.metric_names() else " (run with record_every = 0: no records; "
                   "the final models are in models/final)")
                + ("" if left_out is None else f" (run with {_text(left_out)})")
            )
        d = m[name]
        if d.ndim != 2:
            raise ResultError(f"{self._path}: metric {name!r} is not per-run (records, runs) data")
        return np.asarray(d[: self.n_records()], dtype=np.float64)

    def final(self, name: str = "psi") -> np.ndarray:
        """The metric at the last recorded iteration, (runs,); NaN if nothing was recorded."""
        values = self.metric(name)
        if values.shape[0] == 0:
            return np.full(values.shape[1], np.nan)
        return values[-1].copy()

    def final_iteration(self) -> int:
        """The last recorded iteration k, or -1 if nothing was recorded."""
        it = self.iterations()
        return int(it[-1]) if it.size else -1

    def reference(self) -> dict[str, Any]:
        """Reference quantities (theta_star, f_star, theta_isolated, psi_isolated...)."""
        ref = self._g.get("reference")
        if not isinstance(ref, h5py.Group):
            return {}
        out: dict[str, Any] = {}
        for k, d in ref.items():
            if isinstance(d, h5py.Dataset):
                v = d[()]
                out[k] = v.item() if isinstance(v, np.ndarray) and v.shape == () else v
                if isinstance(out[k], np.generic):
                    out[k] = out[k].item()
        return out

    def psi_isolated(self, owner: int = 0) -> float | None:
        """psi of owner `owner`'s isolated non-private optimum, if recorded."""
        iso = self.reference().get("psi_isolated")
        if iso is None:
            return None
        iso = np.atleast_1d(np.asarray(iso, dtype=float))
        return float(iso[owner]) if owner < iso.size else None

    def ledger(self) -> np.ndarray | None:
        """The per-owner privacy ledger (structured array), or None."""
        d = self._g.get("privacy/ledger")
        return np.asarray(d[()]) if isinstance(d, h5py.Dataset) else None


class Result:
    """An open mpi_dp result file; use as a context manager or call close()."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            partial = partial_path(self.path)
            if partial.exists():  # the job has not completed (yet): read what it wrote
                self.path = partial
            else:
                from mpi_dp.analysis.result_checks import missing_note

                raise ResultNotFoundError(f"result file not found: {self.path}"
                                          f"{missing_note(self.path)}")
        if self.path.is_dir():
            raise ResultFileError(f"{self.path} is a directory; give a result file written by "
                                  "mpi-dp run (e.g. results/demo.h5)")
        try:
            self._f = _open_h5(self.path)
        except OSError as exc:
            raise ResultFileError(f"{self.path}: not a readable HDF5 file ({exc})") from exc
        try:
            self._load()
        except (OSError, RuntimeError) as exc:  # HDF5's errors on damaged metadata
            self._f.close()
            raise ResultFileError(f"{self.path}: the result file is damaged: its attributes or "
                                  f"configurations cannot be read ({exc})") from None
        except BaseException:
            self._f.close()
            raise

    def _load(self) -> None:
        f = self._f
        self.attrs: dict[str, Any] = {k: _attr_value(v) for k, v in f.attrs.items()}
        fmt = self.attrs.get("format")
        if fmt is None or _text(fmt) != FORMAT:
            raise ResultFileError(
                f"{self.path}: not an mpi_dp result file (root attribute format = {fmt!r}, "
                f"expected {FORMAT!r})"
            )
        version = int(self.attrs.get("format_version", 0))
        if version > FORMAT_VERSION:
            raise ResultFileError(
                f"{self.path}: result format_version {version} is newer than this reader "
                f"({FORMAT_VERSION}); upgrade mpi_dp"
            )
        self.status: str = _text(self.attrs.get("status", "unknown"))
        self.job_text: str = _text(self.attrs.get("job", ""))
        self.algorithm: str = _text(self.attrs.get("algorithm", ""))
        self.variant: str = _text(self.attrs.get("variant", ""))
        try:
            sweep = strict_json.loads(_text(self.attrs.get("sweep", "{}")) or "{}")
        except json.JSONDecodeError as exc:
            raise ResultFileError(f"{self.path}: root attribute sweep is not JSON ({exc})") from exc
        self.sweep: dict[str, Any] = sweep if isinstance(sweep, dict) else {}
        configs = f.get("configs")
        if isinstance(configs, h5py.Group):
            names = sorted(k for k in configs if isinstance(configs[k], h5py.Group))
            self.configs: list[ConfigView] = [
                ConfigView(configs[k], i, self.path) for i, k in enumerate(names)
            ]
        else:
            self.configs = [ConfigView(f, 0, self.path)]

    @property
    def provenance(self) -> dict[str, Any]:
        """The /provenance attributes (empty when the file has none)."""
        g = self._f.get("provenance")
        return {k: _attr_value(v) for k, v in g.attrs.items()} if isinstance(g, h5py.Group) else {}

    def owner_names(self) -> tuple[str, list[str]] | None:
        """(key column, each owner's value) of a shard partitioned by a key column, else None."""
        prov = self.provenance
        if "owner_values" not in prov:
            return None
        try:
            values = json.loads(_text(prov["owner_values"]))
        except json.JSONDecodeError:
            return None
        return _text(prov.get("owner_key", "")), [str(v) for v in values]

    @property
    def completeness(self) -> str | None:
        """None for a complete result; else one line saying what is missing and why."""
        if self.status == "complete":
            block = self.attrs.get("config_block")
            n = int(self.attrs.get("n_configs", 0))
            if block is None or (int(block[0]), int(block[1])) == (0, n):
                return None
            return (f"PART: {self.path} holds configurations {int(block[0])}:{int(block[1])} of "
                    f"the job's {n} (one block of a split sweep; mpi-dp merge combines the parts)")
        where = progress_text(self.attrs)
        if self.status == "running":
            gone = writer_gone(self.attrs)
            if gone:
                return (f"INCOMPLETE: the job that wrote {self.path} is gone (killed?); it "
                        f"stopped at {where}. What follows covers only the records written.")
            if gone is None:
                return f"incomplete: {self.path} is still being written or its job died ({where})"
            return f"incomplete: the job is still running ({where})"
        return (f"INCOMPLETE: the job ended with status {self.status} ({where}); what follows "
                "covers only the records written")

    @property
    def job_name(self) -> str:
        """The job's name (TOML `name` or `[job] name`), else the file stem."""
        if _toml is not None and self.job_text:
            try:
                job = _toml.loads(self.job_text)
            except Exception:  # noqa: BLE001 - a broken job text must not stop analysis
                job = {}
            for table in (job, job.get("job", {}) if isinstance(job.get("job"), dict) else {}):
                name = table.get("name")
                if isinstance(name, str) and name:
                    return name
        return self.path.stem

    @property
    def is_sweep(self) -> bool:
        """True when the file holds several configurations (a sweep)."""
        return bool(self.sweep) or len(self.configs) > 1

    def close(self) -> None:
        """Close the HDF5 file."""
        self._f.close()

    def __enter__(self) -> Result:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Result({str(self.path)!r}, algorithm={self.algorithm!r}, status={self.status!r}, "
            f"configs={len(self.configs)})"
        )


#: what the analysis summarises where a result recorded no psi (reference.solver = 'none')
NO_PSI_METRIC = "objective"


def shown_metric(result: Result, preferred: str) -> str:
    """`preferred`, or NO_PSI_METRIC where no configuration recorded `preferred` but every one
    recorded that (a star job run with reference.solver = 'none' has no theta*, so no psi)."""
    names = [set(c.metric_names()) for c in result.configs]
    if any(preferred in n for n in names) or not names:
        return preferred
    return NO_PSI_METRIC if all(NO_PSI_METRIC in n for n in names) else preferred


def open_result(path: str | Path) -> Result:
    """Open a result file for reading (close it, or use it as a context manager)."""
    return Result(path)
