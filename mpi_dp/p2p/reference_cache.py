"""On-disk cache of p2p's evaluation-only reference (local models, Q of the baselines, Theta*, Q*).

The reference of a configuration (`driver.reference`) is a deterministic function of the
peers' records, the public graph and sizes, the objective's constants and the solver: at 1,024
peers it takes rank 0 tens of seconds (the logistic Theta*: L-BFGS, then Newton polish by sparse
direct solves), more than all the wake-ups. It is computed once and stored here, keyed by a
SHA-256 digest of everything it reads:

* every peer's training records X_i, y_i (shape, dtype and bytes; digested by the rank hosting
  the peer and combined in peer order, so the key is the same on any rank count), and those of
  rank 0's full copy where Theta* is solved from it;
* the graph W (CSR arrays), m, lam, c, D_ii, L_loc, mu, the loss and what is asked for (the
  solver, with the rank count for the distributed KSP, whose preconditioner depends on it);
* the code that computes it (the source of this package's reference, objective, driver and
  reference_cache, and of models.reference) and what may change its rounding: numpy, scipy (and
  petsc4py) versions, the machine, the BLAS thread settings.

A different shard file, split, parameter or code version gives a different key, so an entry is
never used for anything but what produced it. An entry is an .npz file (no pickles) holding its
key and a digest of its values; one that does not load, or whose key or digest does not match, is
ignored (and overwritten by the recomputed value). Entries are written atomically (a temporary
file, then a rename), so concurrent jobs sharing the folder never read half a file.

Where: the job key p2p.reference_cache: 'auto' (default) is $MPI_DP_CACHE/p2p_reference if
MPI_DP_CACHE is set, else ~/.cache/mpi_dp/p2p_reference; 'off' disables the cache; anything else
is a folder. The cached values hold what the result file already holds (models/theta_local,
reference/theta_star): evaluation-only, never released.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

#: environment variable naming the cache root (as MPI_DP_DATA_CACHE does for fetched data)
CACHE_ENV = "MPI_DP_CACHE"
#: bump when the entry format or the meaning of a key changes
FORMAT = "mpi_dp p2p reference cache v1"
#: modules whose code computes the reference: their source is part of every key
_CODE = ("p2p/reference.py", "p2p/objective.py", "models/reference.py",
         "p2p/driver.py", "p2p/reference_cache.py")
_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
               "BLIS_NUM_THREADS")


def cache_dir(spec: str) -> Path | None:
    """The cache folder of p2p.reference_cache = `spec` ('auto', 'off' or a folder)."""
    if spec == "off":
        return None
    if spec == "auto":
        root = os.environ.get(CACHE_ENV)
        base = Path(root) if root else Path.home() / ".cache" / "mpi_dp"
        return base / "p2p_reference"
    return Path(spec)


class Digest:
    """A SHA-256 over tagged fields: every field names itself, its type, shape and length, so
    two different sequences of fields never serialise to the same bytes."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def _put(self, tag: str, kind: str, body: bytes) -> None:
        head = f"{tag}|{kind}|{len(body)}|".encode()
        self.h.update(len(head).to_bytes(8, "little") + head + body)

    def text(self, tag: str, value: str) -> Digest:
        self._put(tag, "str", value.encode())
        return self

    def array(self, tag: str, a: Any) -> Digest:
        """An array by dtype, shape and bytes (None: its own marker)."""
        if a is None:
            self._put(tag, "none", b"")
            return self
        a = np.ascontiguousarray(a)
        self._put(tag, f"nd {a.dtype.str} {a.shape}", a.tobytes())
        return self

    def hexdigest(self) -> str:
        return self.h.hexdigest()

    def digest(self) -> bytes:
        return self.h.digest()


def peer_digest(X: Any, y: Any) -> bytes:
    """One peer's training records (X_i, y_i), digested where they live."""
    return Digest().array("X", X).array("y", y).digest()


def code_digest(fmt: str = FORMAT, code: tuple[str, ...] = _CODE,
                extra: dict[str, str] | None = None) -> str:
    """The reference's code and what may change its rounding (see the module docstring):
    entry format `fmt`, the source of the `code` modules (paths in the package), the numerical
    libraries (and `extra` versions, e.g. petsc4py), Python, the machine, the BLAS threads.
    Also the star methods' cache (algorithms.reference_cache) with its own format and code."""
    pkg = Path(__file__).resolve().parent.parent
    d = Digest().text("format", fmt)
    for rel in code:
        d.array(rel, np.frombuffer((pkg / rel).read_bytes(), dtype=np.uint8))
    import scipy

    d.text("numpy", np.__version__).text("scipy", scipy.__version__)
    for k, v in (extra or {}).items():
        d.text(k, v)
    d.text("python", sys.version).text("machine", platform.machine())
    for k in _THREAD_ENV:
        d.text(k, os.environ.get(k, ""))
    return d.hexdigest()


def key_start(code: str, what: dict[str, str]) -> Digest:
    """The start of every reference cache's key: the code digest (`code_digest`), then the
    `what` fields (strings) by name; the caller adds its arrays."""
    d = Digest().text("code", code)
    for k in sorted(what):
        d.text("what:" + k, what[k])
    return d


def make_key(what: dict[str, str], arrays: Iterable[tuple[str, Any]],
             peers: Iterable[bytes], full_peers: Iterable[bytes] | None) -> str:
    """The key (hex) of a reference: `what` (strings: the solver, the loss, ...), the public
    arrays, the peers' digests in peer order, and those of rank 0's full copy (None: unused)."""
    d = key_start(code_digest(), what)
    for tag, a in arrays:
        d.array("arr:" + tag, a)
    peers = list(peers)
    d.text("peers", str(len(peers)))
    for b in peers:
        d.text("peer", b.hex())
    if full_peers is None:
        d.text("full", "none")
    else:
        full_peers = list(full_peers)
        d.text("full", str(len(full_peers)))
        for b in full_peers:
            d.text("full_peer", b.hex())
    return d.hexdigest()


def _values_digest(items: dict[str, np.ndarray]) -> str:
    d = Digest()
    for k in sorted(items):
        d.array(k, items[k])
    return d.hexdigest()


def _encode(ref: dict[str, Any]) -> dict[str, np.ndarray]:
    """A reference dict as named arrays: a_ arrays, f_ floats, s_ strings."""
    out = {}
    for k, v in ref.items():
        if isinstance(v, str):
            out["s_" + k] = np.array(v)
        elif isinstance(v, float):
            out["f_" + k] = np.array(v, dtype=np.float64)
        else:
            a = np.asarray(v)
            if a.dtype != np.float64:
                raise TypeError(f"reference value {k!r} is {a.dtype}, not float64")
            out["a_" + k] = a
    return out


def _decode(items: dict[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in items.items():
        kind, name = k[:2], k[2:]
        if kind == "s_" and v.dtype.kind == "U" and v.ndim == 0:
            out[name] = str(v)
        elif kind == "f_" and v.dtype == np.float64 and v.ndim == 0:
            out[name] = float(v)
        elif kind == "a_" and v.dtype == np.float64:
            out[name] = np.ascontiguousarray(v)
        else:
            raise ValueError(f"unexpected entry {k!r} ({v.dtype}, {v.shape})")
    return out


def entry_path(folder: Path, key: str) -> Path:
    return folder / f"{key}.npz"


def load(folder: Path | None, key: str, expect: dict[str, tuple[int, ...] | None]
         ) -> dict[str, Any] | None:
    """The entry of `key`, or None when there is none or it cannot be trusted (unreadable,
    another key, a values digest that does not match, or not the `expect`ed values: name ->
    array shape, or None for a scalar or string)."""
    if folder is None:
        return None
    path = entry_path(folder, key)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            items = {k: z[k] for k in z.files}
        if str(items.pop("__key__")) != key:
            return None
        check = str(items.pop("__values__"))
        if _values_digest(items) != check:
            return None
        ref = _decode(items)
    except Exception:  # noqa: BLE001 - a damaged entry of any kind is recomputed, never trusted
        return None
    if set(ref) != set(expect):
        return None
    for k, shape in expect.items():
        v = ref[k]
        if shape is not None and (not isinstance(v, np.ndarray) or v.shape != shape
                                  or not np.all(np.isfinite(v))):
            return None
    return ref


def store(folder: Path | None, key: str, ref: dict[str, Any]) -> Path | None:
    """Write `ref` as the entry of `key` (atomically); returns its path, or None when the
    folder cannot be written (a cache is an optimisation: the run goes on without it)."""
    if folder is None:
        return None
    items: dict[str, Any] = _encode(ref)  # Any: savez's **kwds beside its allow_pickle flag
    items["__values__"] = np.array(_values_digest(items))
    items["__key__"] = np.array(key)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **items)
            os.replace(tmp, entry_path(folder, key))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        return None
    return entry_path(folder, key)
