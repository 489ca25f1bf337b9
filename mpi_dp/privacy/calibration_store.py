"""On-disk cache of noise calibrations across jobs (privacy.calibration's pld and basic rules),
and of the accountants' totals of a composition that needs dp-accounting (accountants._totals:
a ledger's PLD and RDP totals at the end of a configuration).

A pld search composes privacy loss distributions about a dozen times (half a second at T = 200,
minutes at T = 1e6) and first imports dp-accounting (about a second); the next job with the same
plan would find the same noise, bit for bit. So every calibration with noise is stored here once
and read back by later jobs, keyed by a SHA-256 of everything its bits depend on:

* the rule and every field of the plan (floats by float.hex, the fixed releases by type and every
  field: `encode`);
* the code: CODE_VERSION, and the source of the modules that compute a calibration
  (calibration.py, accountants.py, events.py and this one), so an edited search never reads an
  old answer;
* what may change its rounding: the versions of dp-accounting, scipy (brentq), numpy and Python,
  and the machine (`environment`).

An entry is a JSON file holding that key in full and the calibration's floats by float.hex (no
pickles); one that does not parse, or whose key is not the one asked for, is ignored and
overwritten by the recomputed calibration. Entries are written atomically (a temporary file,
then os.replace), so concurrent jobs sharing the folder never read half a file; a folder that
cannot be written only costs the search next time. Only rank 0 calibrates (runner) and composes
the ledgers of a multi-rank job (algorithms.common.gather_ledgers), so mostly only it reads and
writes here; concurrent writers of one entry write the same bits.

Where: $MPI_DP_CALIBRATION_CACHE: unset or 'auto': $MPI_DP_CACHE/calibration if MPI_DP_CACHE is
set, else ~/.cache/mpi_dp/calibration (the base of p2p's reference cache); 'off': no disk cache;
anything else: the folder. Pure: no MPI, and no dp-accounting (versions by package metadata).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

#: bump when a change of the calibration code changes a calibration's bits (the modules' source
#: is in the key too: this says so where the change is elsewhere, e.g. a dependency's use)
CODE_VERSION = 1
#: the entry format
FORMAT = "mpi_dp calibration cache v1"
#: environment variable of this cache's folder ('auto', 'off' or a folder)
ENV = "MPI_DP_CALIBRATION_CACHE"
#: environment variable of the root of mpi_dp's caches (as p2p.reference_cache's CACHE_ENV)
ROOT_ENV = "MPI_DP_CACHE"
#: modules whose source computes a calibration (relative to mpi_dp/privacy)
_CODE = ("calibration.py", "accountants.py", "events.py", "calibration_store.py")
_PACKAGES = ("dp-accounting", "scipy", "numpy")


class Uncachable(TypeError):
    """A plan holding a value this cache cannot state exactly (it is then not cached)."""


def folder() -> Path | None:
    """The cache folder ($MPI_DP_CALIBRATION_CACHE, see the module docstring); None when off."""
    spec = os.environ.get(ENV, "auto").strip()
    if spec == "off":
        return None
    if spec in ("auto", ""):
        root = os.environ.get(ROOT_ENV)
        return (Path(root) if root else Path.home() / ".cache" / "mpi_dp") / "calibration"
    return Path(spec).expanduser()


@functools.cache
def environment() -> dict[str, str]:
    """What a calibration's bits depend on besides the plan: the code and the versions."""
    from importlib import metadata

    here = Path(__file__).resolve().parent
    code = hashlib.sha256()
    for rel in _CODE:
        body = (here / rel).read_bytes()
        code.update(f"{rel}|{len(body)}|".encode() + body)
    env = {"code_version": str(CODE_VERSION), "code": code.hexdigest(),
           "python": sys.version, "machine": platform.machine()}
    for pkg in _PACKAGES:
        try:
            env[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            env[pkg] = "none"
    return env


def encode(value: Any) -> Any:
    """`value` (a plan, an event, a number, a string or a tuple of them) as JSON that states it
    exactly: floats by float.hex, dataclasses by type and every field."""
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, str):
        return {"str": value}
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": f"{type(value).__module__}.{type(value).__qualname__}",
                "fields": {f.name: encode(getattr(value, f.name))
                           for f in dataclasses.fields(value)}}
    import numpy as np

    if isinstance(value, np.bool_):
        return encode(bool(value))
    if isinstance(value, np.integer):
        return encode(int(value))
    if isinstance(value, np.floating):
        return encode(float(value))
    raise Uncachable(f"cannot state a {type(value).__name__} exactly")


def _key(parts: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The full key (with the format and the environment) and its file name."""
    key = {"format": FORMAT, "environment": environment(), **parts}
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return key, hashlib.sha256(text.encode()).hexdigest() + ".json"


def load(parts: dict[str, Any]) -> dict[str, Any] | None:
    """The value stored under the key `parts` (JSON values), or None: no entry, the cache off,
    or an entry that cannot be trusted (unreadable, not JSON, another key)."""
    where = folder()
    if where is None:
        return None
    key, name = _key(parts)
    try:
        entry = json.loads((where / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none, or damaged (UnicodeDecodeError is a ValueError)
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    value = entry.get("value")
    return value if isinstance(value, dict) else None


def save(parts: dict[str, Any], value: dict[str, Any]) -> Path | None:
    """Store `value` (JSON values) under the key `parts`, atomically; the path, or None when
    the cache is off or its folder cannot be written (a cache never stops a job)."""
    where = folder()
    if where is None:
        return None
    key, name = _key(parts)
    text = json.dumps({"key": key, "value": value}, sort_keys=True, indent=1, allow_nan=False)
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name[:16]}.", suffix=".tmp", dir=where)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, where / name)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        return None
    return where / name


def hexes(values: dict[str, float]) -> dict[str, str]:
    """Floats by float.hex (exact, inf and nan included)."""
    return {k: float(v).hex() for k, v in values.items()}


def floats(values: Any, names: tuple[str, ...]) -> dict[str, float] | None:
    """The floats `names` of a `hexes` dict, or None where it is not exactly that."""
    if not isinstance(values, dict) or set(values) != set(names):
        return None
    try:
        return {k: float.fromhex(values[k]) for k in names}
    except (TypeError, ValueError):
        return None
