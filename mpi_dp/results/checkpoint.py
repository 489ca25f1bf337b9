"""A method's checkpoint state <-> an HDF5 group of plain datasets (no pickle).

`write_state(group, state)` stores a state, `read_state(group)` gives it back: nested dicts (any
of the supported values as keys: str, int, tuples of them, ...), lists, tuples, None, bool, int
(any size), float, str, numpy scalars and arrays of a numeric or bool dtype (dtype, shape, memory
order and every bit kept), and objects of the classes allowed below (`ALLOWED`, `register`):
rebuilt with ``cls.__new__(cls)`` and their attributes, never by importing a class a file names.

Layout of the group (format `CHECKPOINT_FORMAT_VERSION`, attribute `format_version`; attribute
`digest`: the SHA-256 of everything below and of the writer's `context`, below):
  structure    a JSON text (scalar string dataset): the state's tree, each node a list
               [tag, ...]: ["N"] None, ["b", v] bool, ["i", v] int, ["f", text] float
               (float.hex; a NaN "nan:" and its 8 bytes in hex), ["s", text] str,
               ["x", dtype, bytes in hex] numpy scalar, ["a", dataset, dtype, order] array,
               ["l", [nodes]] list, ["t", [nodes]] tuple, ["d", [[key, value], ...]] dict,
               ["o", class, [[attribute, node], ...]] object, ["S", "l" or "t" or "d", n,
               [stack, ...]] a stacked container (below)
  d0, d1, ...  the leaves: the arrays, and the columns of the stacked containers

A container of many entries of one structure (10^4 owners keyed by id, each with its arrays,
noise position and ledger) is stacked, not stored entry by entry: the entries are grouped by
their template (the entry's tree with every number, array and numpy scalar a leaf; dict keys are
part of the entry), and each group stores one dataset per leaf, its column over the group's
entries ((m,) for scalars, (m,) + shape for arrays), with the entries' positions in the container
where there are several groups: {"tmpl": template, "count": m, "pos": dataset | null,
"leaves": [dataset, ...]}; a template's leaves are ["L", j, kind] (kind: b, i, f, I<words>
(an int beyond int64: <words> uint64 words, two's complement), x<dtype>,
a<dtype>;<C or F>;<shape>).

A checkpoint proves itself: `digest` covers the structure text, every dataset (name, dtype, shape,
bytes) and the `context` the writer gives (the recorder's: the job, the data's SHA-256, the
configuration and the records the state goes with). `read_state` recomputes it before anything
is built and refuses a checkpoint that does not match (CheckpointDigestError): one altered value,
an RNG position moved, an entry of another shape, a checkpoint of another job or data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import importlib
import json
import struct
from collections.abc import Callable, Iterator
from typing import Any

import h5py
import numpy as np

#: version of the layout above; a checkpoint of another version is not read (CheckpointError).
#: 2: the attribute `digest` (version 1 had none)
CHECKPOINT_FORMAT_VERSION = 2

#: containers of at least this many entries are stacked (entries of one template share datasets)
STACK_MIN = 4

_INT64 = (-(1 << 63), (1 << 63) - 1)
_DTYPE_KINDS = "biufc"  # bool, signed, unsigned, float, complex


class CheckpointError(ValueError):
    """A checkpoint this version cannot read (another format version, an unknown class, a
    malformed tree), or a state it cannot write (an unsupported value)."""


class CheckpointDigestError(CheckpointError):
    """A checkpoint whose content does not match its digest: altered or damaged after it was
    written, or written for another job, data, configuration or record count."""

    def __init__(self, detail: str = "") -> None:
        super().__init__("the checkpoint does not match its digest"
                         + (f": {detail}" if detail else ""))


def _dataset_hash(name: str, a: np.ndarray) -> bytes:
    """SHA-256 of one dataset: its name, dtype (little-endian), shape and bytes (C order)."""
    a = np.asarray(a)
    dt = a.dtype.newbyteorder("<")
    a = a.astype(dt, copy=False)
    if not a.flags.c_contiguous:
        a = a.copy(order="C")
    h = hashlib.sha256(f"{name}|{dt.str}|{a.shape}|".encode())
    h.update(a.reshape(-1).data)
    return h.digest()


def _digest(context: str, structure: bytes, hashes: dict[str, bytes]) -> str:
    """The checkpoint's digest: its context, structure text and datasets (by name)."""
    h = hashlib.sha256(b"mpi_dp checkpoint digest 1\0")
    for part in (context.encode(), structure):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    for name in sorted(hashes):
        h.update(len(name).to_bytes(8, "little"))
        h.update(name.encode())
        h.update(hashes[name])
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class _Allowed:
    module: str
    qualname: str
    #: attributes not stored (caches), None after a load
    transient: tuple[str, ...] = ()
    #: called with the rebuilt object (re-links shared references)
    after_load: Callable[[Any], None] | None = None


def _relink_scheduler(sched: Any) -> None:
    """A poisson Scheduler's exponential buffers draw from its generators (the same objects)."""
    if hasattr(sched, "_exp"):  # poisson only
        for buf, gen in zip(sched._exp, sched.gens, strict=True):
            buf.gen = gen


#: the classes a checkpoint may hold, by module.qualname (imported from this list only)
ALLOWED: dict[str, _Allowed] = {f"{a.module}.{a.qualname}": a for a in (
    _Allowed("mpi_dp.privacy.ledger", "Ledger", transient=("_last",)),
    _Allowed("mpi_dp.privacy.ledger", "_PlanLimit"),
    _Allowed("mpi_dp.privacy.events", "LaplaceEvent"),
    _Allowed("mpi_dp.privacy.events", "GaussianEvent"),
    _Allowed("mpi_dp.privacy.events", "PureEvent"),
    _Allowed("mpi_dp.privacy.calibration", "Plan"),
    _Allowed("mpi_dp.privacy.calibration", "Calibration"),
    _Allowed("mpi_dp.privacy.rules", "BasicSplitNoise"),
    _Allowed("mpi_dp.privacy.rules", "PerIterationNoise"),
    _Allowed("mpi_dp.privacy.rules", "PerReleaseNoise"),
    _Allowed("mpi_dp.privacy.rules", "Theorem1Noise"),
    _Allowed("mpi_dp.privacy.accountants", "Totals"),
    _Allowed("mpi_dp.comm.schedule", "Scheduler", after_load=_relink_scheduler),
    _Allowed("mpi_dp.comm.schedule", "LoggedSchedule"),
    _Allowed("mpi_dp.comm.schedule", "_ExpBuffer", transient=("gen",)),
    _Allowed("mpi_dp.algorithms.async_star", "Trace"),
)}

_CLASSES: dict[str, type] = {}  # name -> class, resolved
_NAMES: dict[type, str] = {}    # class -> name

#: numpy bit generators a stored numpy Generator may name
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")
_GENERATOR = "numpy.random.Generator"


def register(cls: type, transient: tuple[str, ...] = (),
             after_load: Callable[[Any], None] | None = None) -> type:
    """Allow objects of `cls` in checkpoints (`@register` works as a class decorator): stored as
    their attributes (`transient` ones left out, None after a load), rebuilt by cls.__new__."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    ALLOWED[name] = _Allowed(cls.__module__, cls.__qualname__, tuple(transient), after_load)
    _CLASSES[name], _NAMES[cls] = cls, name
    return cls


def _class(name: str) -> type:
    """The allowed class `name` (CheckpointError for any other name)."""
    cls = _CLASSES.get(name)
    if cls is not None:
        return cls
    spec = ALLOWED.get(name)
    if spec is None:
        raise CheckpointError(f"checkpoint names class {name!r}, which is not among the classes "
                              "a checkpoint may hold (mpi_dp.results.checkpoint.ALLOWED)")
    obj: Any = importlib.import_module(spec.module)
    for part in spec.qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise CheckpointError(f"{name} is not a class")
    _CLASSES[name], _NAMES[obj] = obj, name
    return obj


def _name_of(v: Any) -> str:
    """The allowed name of v's class (CheckpointError for a class not allowed)."""
    t = type(v)
    if t is np.random.Generator:
        return _GENERATOR
    name = _NAMES.get(t)
    if name is not None:
        return name
    name = f"{t.__module__}.{t.__qualname__}"
    if name in ALLOWED and _class(name) is t:
        return name
    raise CheckpointError(f"cannot checkpoint a value of type {name}: not a plain value nor a "
                          "class allowed in checkpoints (mpi_dp.results.checkpoint.ALLOWED)")


def _attrs(v: Any, name: str) -> list[tuple[str, Any]]:
    """The stored attributes of an allowed object (a numpy Generator: its bit generator's state)."""
    if name == _GENERATOR:
        return [("state", v.bit_generator.state)]
    skip = ALLOWED[name].transient
    return [(k, x) for k, x in vars(v).items() if k not in skip]


def _make(name: str, attrs: dict[str, Any]) -> Any:
    if name == _GENERATOR:
        state = attrs["state"]
        bg = state.get("bit_generator") if isinstance(state, dict) else None
        if bg not in _BIT_GENERATORS:
            raise CheckpointError(f"checkpoint names bit generator {bg!r}, not one of "
                                  f"{_BIT_GENERATORS}")
        gen = getattr(np.random, bg)()
        gen.state = state
        return np.random.Generator(gen)
    cls: Any = _class(name)  # Any: mypy would resolve cls.__new__ to type.__new__
    obj = cls.__new__(cls)
    spec = ALLOWED[name]
    d = obj.__dict__
    d.update(attrs)
    for k in spec.transient:
        d[k] = None
    if spec.after_load is not None:
        spec.after_load(obj)
    return obj


def _array_dtype(dt: np.dtype) -> np.dtype:
    if dt.kind not in _DTYPE_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise CheckpointError(f"cannot checkpoint an array of dtype {dt}: numeric and bool "
                              "dtypes only")
    return dt


def _order(a: np.ndarray) -> str:
    return "F" if a.ndim > 1 and a.flags.f_contiguous and not a.flags.c_contiguous else "C"


def _big_words(x: int) -> int:
    return max(3, (x.bit_length() + 64) // 64)  # room for the sign bit; 128-bit states: 3


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while the many small containers of a large state are made
    (they hold no cycles; the collector's passes over them would double the time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# -- writing ------------------------------------------------------------------------------------
class _Writer:
    def __init__(self, group: h5py.Group) -> None:
        self.group = group
        self.n = 0
        #: each dataset's hash (_dataset_hash), for the digest
        self.hashes: dict[str, bytes] = {}

    def dataset(self, data: np.ndarray) -> str:
        name = f"d{self.n}"
        self.n += 1
        self.group.create_dataset(name, data=data)
        self.hashes[name] = _dataset_hash(name, data)
        return name

    # a value outside any stacked container: scalars inline in the tree, arrays as datasets
    def node(self, v: Any) -> list:
        if v is None:
            return ["N"]
        if isinstance(v, np.generic):
            dt = _array_dtype(v.dtype)
            return ["x", dt.str, np.asarray(v).tobytes().hex()]
        t = type(v)
        if t is bool:
            return ["b", v]
        if t is int:
            return ["i", v]
        if t is float:
            return ["f", v.hex() if v == v else f"nan:{struct.pack('<d', v).hex()}"]
        if t is str:
            return ["s", v]
        if t is np.ndarray:
            dt = _array_dtype(v.dtype)
            return ["a", self.dataset(v), dt.str, _order(v)]
        if t is list or t is tuple or t is dict:
            entries = list(v.items()) if t is dict else v
            tag = "d" if t is dict else "l" if t is list else "t"
            if len(entries) >= STACK_MIN:
                stacked = self.stacked(tag, entries)
                if stacked is not None:
                    return stacked
            if t is dict:
                return ["d", [[self.node(k), self.node(x)] for k, x in entries]]
            return [tag, [self.node(x) for x in entries]]
        name = _name_of(v)
        return ["o", name, [[k, self.node(x)] for k, x in _attrs(v, name)]]

    def stacked(self, tag: str, entries: list) -> list | None:
        """A container's entries grouped by template, one dataset per leaf of each group (None:
        too few entries share a template to gain anything)."""
        groups: dict[tuple, list[int]] = {}
        leaves: list[list] = []
        for i, e in enumerate(entries):
            got: list = []
            tmpl = (("t", (_template(e[0], got), _template(e[1], got))) if tag == "d"
                    else _template(e, got))
            leaves.append(got)
            groups.setdefault(tmpl, []).append(i)
        if 2 * len(groups) > len(entries):
            return None
        out = []
        for tmpl, idx in groups.items():
            kinds: list[str] = []
            tree = _template_json(tmpl, kinds)
            cols = []
            for j, kind in enumerate(kinds):
                cols.append(self.dataset(_column(kind, [leaves[i][j] for i in idx])))
            pos = None if len(groups) == 1 else self.dataset(np.asarray(idx, dtype=np.int64))
            out.append({"tmpl": tree, "count": len(idx), "pos": pos, "leaves": cols})
        return ["S", tag, len(entries), out]


def _template(v: Any, leaves: list) -> tuple:
    """The hashable template of a value inside a stacked container; its leaves appended."""
    f = _TEMPLATE.get(type(v))
    if f is not None:
        return f(v, leaves)
    if isinstance(v, np.generic):
        leaves.append(v)
        return ("L", "x" + _array_dtype(v.dtype).str)
    hit = _MEMO.get(id(v))  # an object met before in this write (a calibration owners share)
    if hit is not None:
        leaves.extend(hit[1])
        return hit[0]
    name = _name_of(v)
    got: list = []
    t = ("o", name, tuple([(k, _template(x, got)) for k, x in _attrs(v, name)]))
    _MEMO[id(v)] = (t, got)
    leaves.extend(got)
    return t


#: id -> (template, leaves) of the objects met in the write in progress (alive until it ends)
_MEMO: dict[int, tuple[tuple, list]] = {}
_LEAF_B, _LEAF_I, _LEAF_F, _NONE = ("L", "b"), ("L", "i"), ("L", "f"), ("N",)
_ARRAY_KINDS: dict[tuple, tuple] = {}


def _t_int(v: int, leaves: list) -> tuple:
    leaves.append(v)
    return _LEAF_I if _INT64[0] <= v <= _INT64[1] else ("L", f"I{_big_words(v)}")


def _t_array(v: np.ndarray, leaves: list) -> tuple:
    leaves.append(v)
    key = (v.dtype, v.shape, _order(v))
    kind = _ARRAY_KINDS.get(key)
    if kind is None:
        shape = ",".join(str(n) for n in v.shape)
        kind = _ARRAY_KINDS[key] = ("L", f"a{_array_dtype(v.dtype).str};{key[2]};{shape}")
    return kind


def _t_leaf(kind: tuple) -> Callable[[Any, list], tuple]:
    def leaf(v: Any, leaves: list) -> tuple:
        leaves.append(v)
        return kind
    return leaf


_TEMPLATE: dict[type, Callable[[Any, list], tuple]] = {
    type(None): lambda v, leaves: _NONE,
    bool: _t_leaf(_LEAF_B),
    int: _t_int,
    float: _t_leaf(_LEAF_F),
    str: lambda v, leaves: ("s", v),
    np.ndarray: _t_array,
    list: lambda v, leaves: ("l", tuple([_template(x, leaves) for x in v])),
    tuple: lambda v, leaves: ("t", tuple([_template(x, leaves) for x in v])),
    dict: lambda v, leaves: ("d", tuple([(_template(k, leaves), _template(x, leaves))
                                         for k, x in v.items()])),
}


def _template_json(t: tuple, kinds: list[str]) -> list:
    tag = t[0]
    if tag == "L":
        kinds.append(t[1])
        return ["L", len(kinds) - 1, t[1]]
    if tag in ("N", "s"):
        return list(t)
    if tag in ("l", "t"):
        return [tag, [_template_json(x, kinds) for x in t[1]]]
    if tag == "d":
        return ["d", [[_template_json(k, kinds), _template_json(x, kinds)] for k, x in t[1]]]
    return ["o", t[1], [[k, _template_json(x, kinds)] for k, x in t[2]]]


def _column(kind: str, values: list) -> np.ndarray:
    c = kind[0]
    if c == "b":
        return np.array(values, dtype=bool)
    if c == "i":
        return np.array(values, dtype=np.int64)
    if c == "f":
        return np.array(values, dtype=np.float64)
    if c == "I":
        words = int(kind[1:])
        out = np.empty((len(values), words), dtype=np.uint64)
        mask = (1 << 64) - 1
        for r, x in enumerate(values):
            x &= (1 << (64 * words)) - 1  # two's complement
            out[r] = [(x >> (64 * w)) & mask for w in range(words)]
        return out
    if c == "x":
        return np.array(values, dtype=np.dtype(kind[1:]))
    dt = np.dtype(kind[1:].split(";")[0])
    return np.stack(values).astype(dt, copy=False) if values else np.empty(0, dtype=dt)


def write_state(group: h5py.Group, state: Any, context: str = "") -> None:
    """Store `state` in the (empty) group `group`: the tree, its datasets, `format_version` and
    `digest` (of all of it and `context`: what the state belongs to; `read_state` needs the
    same). CheckpointError, with nothing meaningful written, for a value the format does not
    hold."""
    w = _Writer(group)
    _MEMO.clear()
    try:
        with _gc_paused():
            tree = w.node(state)
    finally:
        _MEMO.clear()
    text = json.dumps(tree, separators=(",", ":"))
    group.create_dataset("structure", data=text, dtype=h5py.string_dtype())
    group.attrs["format_version"] = CHECKPOINT_FORMAT_VERSION
    group.attrs["digest"] = _digest(context, text.encode(), w.hashes)


# -- reading ------------------------------------------------------------------------------------
def _bad(what: str) -> CheckpointError:
    return CheckpointError(f"malformed checkpoint: {what}")


def _big(words: np.ndarray) -> int:
    n = words.size
    x = 0
    for w in range(n - 1, -1, -1):
        x = (x << 64) | int(words[w])
    return x - (1 << (64 * n)) if x >> (64 * n - 1) else x


def _shaped(a: np.ndarray, dtype: str, order: str) -> np.ndarray:
    a = np.asarray(a).astype(np.dtype(dtype), copy=False)
    if order == "F":
        return a.copy(order="F")
    return a if a.flags.c_contiguous else a.copy(order="C")


class _Reader:
    def __init__(self, group: h5py.Group, arrays: dict[str, np.ndarray]) -> None:
        self.group = group
        self.arrays = arrays  # the datasets read to check the digest (each used once)

    def dataset(self, name: Any) -> np.ndarray:
        if isinstance(name, str) and name in self.arrays:
            return self.arrays.pop(name)
        if not isinstance(name, str) or name == "structure" or name not in self.group:
            raise _bad(f"no dataset {name!r}")
        ds = self.group[name]
        if not isinstance(ds, h5py.Dataset):
            raise _bad(f"{name!r} is not a dataset")
        return ds[...]

    def node(self, n: Any) -> Any:
        if not isinstance(n, list) or not n:
            raise _bad(f"node {n!r}")
        tag = n[0]
        if tag == "N":
            return None
        if tag == "b":
            return bool(n[1])
        if tag == "i":
            return int(n[1])
        if tag == "f":
            if n[1].startswith("nan:"):  # a NaN, its payload kept
                return struct.unpack("<d", bytes.fromhex(n[1][4:]))[0]
            return float.fromhex(n[1])
        if tag == "s":
            return str(n[1])
        if tag == "x":
            dt = _array_dtype(np.dtype(n[1]))
            return np.frombuffer(bytes.fromhex(n[2]), dtype=dt)[0].copy()
        if tag == "a":
            dt = _array_dtype(np.dtype(n[2]))
            return _shaped(self.dataset(n[1]), dt.str, n[3])
        if tag == "l":
            return [self.node(x) for x in n[1]]
        if tag == "t":
            return tuple(self.node(x) for x in n[1])
        if tag == "d":
            return {self.node(k): self.node(x) for k, x in n[1]}
        if tag == "o":
            return _make(n[1], {str(k): self.node(x) for k, x in n[2]})
        if tag == "S":
            return self.stacked(n[1], int(n[2]), n[3])
        raise _bad(f"unknown tag {tag!r}")

    def stacked(self, tag: str, n: int, groups: list) -> Any:
        entries: list[Any] = [None] * n
        for g in groups:
            m = int(g["count"])
            kinds: list[str] = []
            _leaf_kinds(g["tmpl"], kinds)
            if len(g["leaves"]) != len(kinds):
                raise _bad("a stack's leaves do not match its template")
            cols = iter([_values(kind, self.dataset(name), m)
                         for kind, name in zip(kinds, g["leaves"], strict=True)])
            built = _build(g["tmpl"], cols, m)
            if g["pos"] is None:
                if m != n:
                    raise _bad("a stack's count does not match its container")
                entries = built
            else:
                pos = self.dataset(g["pos"]).tolist()
                if len(pos) != m:
                    raise _bad("a stack's positions do not match its count")
                for p, e in zip(pos, built, strict=True):
                    entries[p] = e
        if tag == "d":
            return dict(entries)
        return entries if tag == "l" else tuple(entries)


def _values(kind: str, col: np.ndarray, m: int) -> list:
    """The column of a stacked leaf as one value per entry."""
    if len(col) != m:
        raise _bad("a stack's column does not match its count")
    c = kind[0]
    if c in "bif":
        want = {"b": np.bool_, "i": np.int64, "f": np.float64}[c]
        return np.asarray(col).astype(want, copy=False).tolist()
    if c == "I":
        return [_big(np.asarray(row, dtype=np.uint64)) for row in col]
    if c == "x":
        dt = _array_dtype(np.dtype(kind[1:]))
        return list(np.asarray(col).astype(dt, copy=False))
    if c != "a":
        raise _bad(f"unknown leaf kind {kind!r}")
    dtype, order, shape = kind[1:].split(";")
    dt = _array_dtype(np.dtype(dtype))
    want_shape = tuple(int(s) for s in shape.split(",")) if shape else ()
    col = np.asarray(col).astype(dt, copy=False)
    if col.shape[1:] != want_shape:
        raise _bad("a stacked array's shape does not match its template")
    if not want_shape:
        return [np.array(x, dtype=dt) for x in col]
    return [x.copy(order=order) for x in col]


def _leaf_kinds(t: Any, kinds: list[str]) -> None:
    """Check a stacked group's template (its classes allowed, its leaves numbered in order) and
    collect its leaves' kinds."""
    if not isinstance(t, list) or not t:
        raise _bad(f"template {t!r}")
    tag = t[0]
    if tag == "L":
        if t[1] != len(kinds):
            raise _bad("template leaves out of order")
        kinds.append(str(t[2]))
    elif tag in ("l", "t"):
        for x in t[1]:
            _leaf_kinds(x, kinds)
    elif tag == "d":
        for k, x in t[1]:
            _leaf_kinds(k, kinds)
            _leaf_kinds(x, kinds)
    elif tag == "o":
        if t[1] != _GENERATOR:
            _class(str(t[1]))  # refused before anything is built
        for _, x in t[2]:
            _leaf_kinds(x, kinds)
    elif tag not in ("N", "s"):
        raise _bad(f"unknown template tag {tag!r}")


def _build(t: list, cols: Iterator[list], m: int) -> list:
    """The m entries of a stacked group, node by node over all entries at once (`cols`: the
    leaves' values, in template order)."""
    tag = t[0]
    if tag == "L":
        return next(cols)
    if tag == "N":
        return [None] * m
    if tag == "s":
        return [str(t[1])] * m
    if tag == "l":
        parts = [_build(x, cols, m) for x in t[1]]
        return [list(v) for v in zip(*parts, strict=True)] if parts else [[] for _ in range(m)]
    if tag == "t":
        parts = [_build(x, cols, m) for x in t[1]]
        return list(zip(*parts, strict=True)) if parts else [()] * m
    if tag == "d":
        keys, values = [], []
        for k, x in t[1]:
            keys.append(_build(k, cols, m))
            values.append(_build(x, cols, m))
        if not keys:
            return [{} for _ in range(m)]
        return [dict(zip(ks, vs, strict=True)) for ks, vs in
                zip(zip(*keys, strict=True), zip(*values, strict=True), strict=True)]
    name = str(t[1])
    names = [str(k) for k, _ in t[2]]
    parts = [_build(x, cols, m) for _, x in t[2]]
    rows = zip(*parts, strict=True) if parts else [()] * m
    return [_make(name, dict(zip(names, r, strict=True))) for r in rows]


def _verified(group: h5py.Group, context: str) -> tuple[bytes, dict[str, np.ndarray]]:
    """The structure text and every dataset of a checkpoint, read once and checked against its
    `digest` before anything is built (CheckpointDigestError: no digest, a member that is not a
    numeric dataset, or a mismatch)."""
    stored = group.attrs.get("digest")
    if stored is None:
        raise CheckpointDigestError("it has none")
    stored = stored.decode() if isinstance(stored, bytes) else str(stored)
    node = group.get("structure")
    text = node[()] if isinstance(node, h5py.Dataset) and node.dtype.kind == "O" else None
    if isinstance(text, str):
        text = text.encode()
    if not isinstance(text, bytes):
        raise CheckpointDigestError("its structure is not a text")
    arrays: dict[str, np.ndarray] = {}
    hashes: dict[str, bytes] = {}
    for name, obj in group.items():
        if name == "structure":
            continue
        if not isinstance(obj, h5py.Dataset) or obj.dtype.kind not in _DTYPE_KINDS:
            raise CheckpointDigestError(f"it holds {name!r}, not a numeric dataset")
        try:
            arrays[name] = obj[...]
        except OSError as e:  # a damaged file
            raise CheckpointDigestError(f"its {name!r} cannot be read ({e})") from e
        hashes[name] = _dataset_hash(name, arrays[name])
    if _digest(context, text, hashes) != stored:
        raise CheckpointDigestError()
    return text, arrays


def read_state(group: h5py.Group, context: str = "") -> Any:
    """The state `write_state` stored in `group` with the same `context`; CheckpointError for a
    group of another format version, a class not allowed, or a malformed tree, and its subclass
    CheckpointDigestError for one that does not match its digest (checked before anything is
    built: an altered value, another shape, another context)."""
    version = group.attrs.get("format_version")
    if version is None or int(version) != CHECKPOINT_FORMAT_VERSION:
        raise CheckpointError(f"checkpoint format version {version!r}, this version reads "
                              f"{CHECKPOINT_FORMAT_VERSION}")
    if "structure" not in group:
        raise _bad("no structure")
    text, arrays = _verified(group, context)
    try:
        tree = json.loads(text.decode())
        with _gc_paused():
            return _Reader(group, arrays).node(tree)
    except CheckpointError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, StopIteration) as e:
        raise _bad(repr(e)) from e
