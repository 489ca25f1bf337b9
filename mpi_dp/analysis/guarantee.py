"""Whether a configuration's privacy guarantee is finite and certified: the one rule every view
(`mpi-dp analyze`, `compare`, `export`, `export --release`) reads a ledger by.

A configuration of a result file holds one `privacy/ledger` row per owner (mpi_dp.privacy.
accountants.LEDGER_DTYPE). Its guarantee is **finite and certified** when

  1. it has a readable, non-empty ledger (`privacy/ledger`, or the per-field `ledger/<field>`
     datasets) that records the contract: `target_eps`, `eps_pld` and `certified`;
  2. no owner trained without noise: no row has target_eps = inf, and not every row is *silent*
     (mechanism 'none', or releases 0): a configuration none of whose owners made a noisy
     release still computed its models from the owners' records, without noise (p2p at
     eps = inf writes such rows, with eps_pld 0: read as eps = inf, never as "perfectly
     private");
  3. every row has a finite target_eps (not NaN) and a finite PLD total eps_pld, and eps_pld > 0
     wherever the owner made noisy releases (0 after releases is an inconsistent ledger);
  4. no row is silent under a finite target while other owners released: a ledger cannot tell an
     owner whose records were never read from one whose records were used without noise, so
     the configuration is not judged private (the same reading as the file's own
     `evaluation_only` marking of models, mpi_dp.results.schema.models_covered). Its silent
     rows keep their recorded totals (0: nothing of theirs was released with noise); the
     verdict says which owners and why;
  5. every row is certified (the noise is the mechanism its calibration assumes) and none was
     calibrated from private data (data_dependent = 0).

An achieved total above the target (e.g. the paper's rule, which reads eps in its own unit) is
still a finite, certified guarantee at that total: the views say "NOT met", not "not private".

Rows whose owner trained without noise (rule 2) are *no-noise rows*: every view shows their
totals (eps_basic, eps_advanced, eps_pld, eps_rdp and the *_all columns) as inf, whatever the
file recorded (`shown_totals`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

#: the ledger fields that are totals of an owner's privacy loss: inf on a no-noise row
TOTAL_FIELDS = ("eps_basic", "eps_advanced", "eps_pld", "eps_rdp", "eps_basic_all",
                "eps_pld_all", "eps_rdp_all", "spent_eps")
#: the fields a ledger needs for a verdict (files from before the contract lack them)
CONTRACT_FIELDS = ("target_eps", "eps_pld", "certified")
#: the mechanism a ledger records for an owner without noisy releases
NO_MECHANISM = "none"
#: the headline of a configuration trained without noise (the start of its reason)
NO_NOISE = "eps = inf: trained without noise"
NO_LEDGER = "no ledger"
UNCERTIFIED = "uncertified"

Rows = np.ndarray | Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class Guarantee:
    """The verdict on one configuration's ledger.

    private: the guarantee is finite and certified (the module's rule); eps: the largest owner
    total by PLD as the views show it (inf where an owner trained without noise; NaN without a
    ledger; a file from before the contract: its basic total); reasons: why it is not private
    (empty when it is), each starting with NO_NOISE, NO_LEDGER, UNCERTIFIED or 'no finite
    total'; no_noise: per ledger row, whether that owner trained without noise."""

    private: bool
    eps: float
    reasons: tuple[str, ...] = ()
    no_noise: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool), compare=False)

    @property
    def reason(self) -> str:
        """The reasons as one line ('' when private)."""
        return "; ".join(self.reasons)

    @property
    def without_noise(self) -> bool:
        """Some owner trained without noise (eps = inf)."""
        return bool(self.no_noise.any())

    @property
    def eps_text(self) -> str:
        """eps as a view prints it: 'inf (no noise)', '%.4g', or '-' when unknown."""
        if math.isinf(self.eps) and self.without_noise:
            return "inf (no noise)"
        return "-" if math.isnan(self.eps) else f"{self.eps:.4g}"


def _text(v: Any) -> str:
    if isinstance(v, bytes | np.bytes_):
        return v.decode("utf-8", "replace").rstrip("\x00")
    return "" if v is None else str(v)


def _columns(rows: Rows) -> dict[str, np.ndarray]:
    """{field: values} of a structured ledger array or of rows as mappings (text decoded)."""
    if isinstance(rows, np.ndarray):
        rows = np.atleast_1d(rows)
        names = rows.dtype.names or ()
        cols = {k: rows[k] for k in names}
    else:
        names = tuple(rows[0]) if len(rows) else ()
        cols = {k: np.asarray([r.get(k) for r in rows], dtype=object) for k in names}
    out: dict[str, np.ndarray] = {}
    for k, v in cols.items():
        if v.dtype.kind in "SUO" and k in ("mechanism", "calibration", "scope"):
            out[k] = np.asarray([_text(x) for x in v], dtype=object)
        else:
            out[k] = v
    return out


def _floats(cols: Mapping[str, np.ndarray], name: str, n: int, default: float = math.nan
            ) -> np.ndarray:
    if name not in cols:
        return np.full(n, default)
    return np.asarray([default if x is None else x for x in cols[name]], dtype=float)


def _agents_text(agents: np.ndarray) -> str:
    """'owner 3', 'owners 0-2,5' (at most 4 ranges, then a count)."""
    values = sorted({int(a) for a in agents})
    spans: list[list[int]] = []
    for v in values:
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in spans]
    shown = ",".join(parts[:4]) + (f",... ({len(values):,} owners)" if len(parts) > 4 else "")
    return ("owner " if len(values) == 1 else "owners ") + shown


def no_noise_rows(rows: Rows) -> np.ndarray:
    """Per row of one configuration's ledger: the owner trained without noise (target_eps = inf,
    or every row of the configuration silent: mechanism 'none' or releases 0)."""
    cols = _columns(rows)
    n = len(next(iter(cols.values()), ()))
    target = _floats(cols, "target_eps", n)
    silent = _silent(cols, n)
    return np.isposinf(target) | (silent & bool(n) & bool(silent.all()))


def _silent(cols: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    silent = np.zeros(n, dtype=bool)
    if "mechanism" in cols:
        silent |= np.asarray([m in (NO_MECHANISM, "") for m in cols["mechanism"]], dtype=bool)
    if "releases" in cols:
        silent |= _floats(cols, "releases", n, 0.0) <= 0
    return silent


def shown_totals(rows: Rows) -> dict[str, np.ndarray]:
    """The total fields (TOTAL_FIELDS present) as every view shows them: inf on no-noise rows,
    the recorded value elsewhere."""
    cols = _columns(rows)
    n = len(next(iter(cols.values()), ()))
    mask = no_noise_rows(rows)
    return {k: np.where(mask, np.inf, _floats(cols, k, n)) for k in TOTAL_FIELDS if k in cols}


def judge_rows(rows: Rows | None) -> Guarantee:
    """The verdict on one configuration's ledger rows (a structured array, or mappings of
    field -> value); None: the configuration has no ledger."""
    if rows is None:
        return Guarantee(False, math.nan, (f"{NO_LEDGER}: the configuration records no "
                                           "privacy/ledger",))
    cols = _columns(rows)
    n = len(next(iter(cols.values()), ()))
    if not n:
        return Guarantee(False, math.nan, (f"{NO_LEDGER}: privacy/ledger is empty",))
    agents = np.asarray(cols["agent"] if "agent" in cols else np.arange(n))
    no_noise = no_noise_rows(rows)
    totals = shown_totals(rows)
    head = next((k for k in ("eps_pld", "eps_basic", "spent_eps") if k in totals), None)
    eps = float(np.max(totals[head])) if head else (math.inf if no_noise.any() else math.nan)
    reasons: list[str] = []
    target = _floats(cols, "target_eps", n)
    silent = _silent(cols, n)
    if no_noise.any():
        why = []
        if np.isposinf(target).any():
            why.append(f"{_agents_text(agents[np.isposinf(target)])}: target eps = inf")
        if silent.all():
            why.append("no owner made a noisy release: mechanism none, releases 0")
        reasons.append(f"{NO_NOISE} ({'; '.join(why)})")
    missing = [k for k in CONTRACT_FIELDS if k not in cols]
    if missing:
        reasons.append(f"{UNCERTIFIED}: the ledger records no contract (no {', '.join(missing)}"
                       "): a file from before the contract")
        return Guarantee(False, eps, tuple(reasons), no_noise)
    rest = ~no_noise  # the rows not already explained by eps = inf
    pld = _floats(cols, "eps_pld", n)
    unknown = rest & np.isnan(target)
    if unknown.any():
        reasons.append(f"{UNCERTIFIED}: {_agents_text(agents[unknown])}: target eps unknown (NaN)")
    quiet = rest & silent & ~unknown
    if quiet.any():
        reasons.append(f"{UNCERTIFIED}: {_agents_text(agents[quiet])} recorded no noisy release "
                       "(mechanism none, releases 0) under a finite target while others did: the "
                       "ledger cannot show their records were never used without noise")
    infinite = rest & ~silent & ~np.isfinite(pld)
    if infinite.any():
        reasons.append(f"no finite total: {_agents_text(agents[infinite])}: eps_pld = "
                       f"{_num(pld[infinite])}")
    zero = rest & ~silent & np.isfinite(pld) & (pld <= 0)
    if zero.any():
        reasons.append(f"{UNCERTIFIED}: {_agents_text(agents[zero])}: eps_pld 0 after noisy "
                       "releases (an inconsistent ledger)")
    certified = np.asarray([bool(x) for x in cols["certified"]], dtype=bool)
    if (~certified).any():
        reasons.append(f"{UNCERTIFIED}: {_agents_text(agents[~certified])}: noise not the "
                       "mechanism its calibration assumes (certified = false)")
    dd = _floats(cols, "data_dependent", n, 0.0)
    if (dd > 0).any():
        reasons.append(f"{UNCERTIFIED}: {_agents_text(agents[dd > 0])}: noise calibrated from "
                       "private data (data_dependent)")
    return Guarantee(not reasons, eps, tuple(reasons), no_noise)


def _num(values: np.ndarray) -> str:
    return "/".join(sorted({"nan" if math.isnan(v) else f"{v:g}" for v in values}))


def ledger_table(g: h5py.Group) -> np.ndarray | None:
    """A configuration's ledger as a structured array: the compound G/privacy/ledger, else the
    per-field datasets G/ledger/<field>; None when it has neither."""
    led = g.get("privacy/ledger")
    if isinstance(led, h5py.Dataset) and led.dtype.names:
        return np.atleast_1d(led[()])
    cols = g.get("ledger")
    if not isinstance(cols, h5py.Group):
        return None
    fields = {k: np.atleast_1d(d[()]) for k, d in cols.items()
              if isinstance(d, h5py.Dataset) and d.ndim == 1 and not d.attrs.get("CLASS")}
    if not fields or len({len(v) for v in fields.values()}) != 1:
        return None
    out = np.zeros(len(next(iter(fields.values()))), dtype=[(k, v.dtype) for k, v in
                                                           fields.items()])
    for k, v in fields.items():
        out[k] = v
    return out


def judge_group(g: h5py.Group) -> Guarantee:
    """The verdict on the configuration stored in the HDF5 group `g` (a result file's
    /configs/<i>, or / for a single configuration)."""
    try:
        table = ledger_table(g)
    except (OSError, KeyError, TypeError, ValueError) as exc:
        return Guarantee(False, math.nan, (f"{NO_LEDGER}: privacy/ledger unreadable ({exc})",))
    return judge_rows(table)


def judge(cfg: Any) -> Guarantee:
    """The verdict on a configuration of an open result (mpi_dp.analysis.load.ConfigView)."""
    return judge_group(cfg.group)


def judge_result(res: Any) -> dict[int, Guarantee]:
    """{configuration index: verdict} of an open result (mpi_dp.analysis.load.Result)."""
    return {c.index: judge(c) for c in res.configs}
