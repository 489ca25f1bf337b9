"""The privacy ledger of a result file as text (what `mpi-dp analyze` prints for every method).

Each configuration group holds a per-agent ledger at `G/privacy/ledger`, one row per agent. Current
files record each owner's contract (its target eps and delta, the calibration rule that set its
noise and what its guarantee composes: the configuration, a record or a selection), the
mechanism, the releases, the per-release eps and noise multiplier, and the totals of that scope at
the owner's delta by four accountants: basic, advanced (Dwork-Rothblum-Vadhan), PLD
(dp-accounting) and RDP, plus the plain composition of every release (*_all), whether the noise
calibration read private data and whether every mechanism is DP as calibrated. The text opens with
one line per configuration: the target, the rule and the achieved tight total (met or not).
Files from before the contract record a budget and its basic spend; they are shown as they are.
Agents whose rows are identical (apart from the agent index) share one line: `owners 0-2`,
`owners 0,2`, `owner 1`.

Whether a configuration is private is mpi_dp.analysis.guarantee's verdict, the one every view
uses: a configuration without a finite, certified guarantee gets "NOT private: <why>" on its
contract line, and an owner that trained without noise (target eps = inf, or no owner of the
configuration made a noisy release) shows every total as inf and the flag "no noise (eps = inf)"
whatever the file recorded (p2p's eps = inf rows record eps_pld 0).
"""

from __future__ import annotations

import math
from typing import Any

import h5py
import numpy as np

from mpi_dp.analysis.guarantee import NO_NOISE, Guarantee, judge_rows, no_noise_rows, shown_totals
from mpi_dp.analysis.load import ConfigView, Result
from mpi_dp.analysis.style import aligned

#: The four accountants' totals: (column heading, ledger field).
TOTALS = (("basic", "eps_basic"), ("advanced", "eps_advanced"), ("PLD", "eps_pld"),
          ("RDP", "eps_rdp"))
NONE_RECORDED = "no privacy ledger recorded"
_LEFT = {"agents", "mechanism", "flags", "label"}


def _num(value: Any) -> str:
    """%.4g, 'inf' for infinity, '-' for a missing or NaN value."""
    if value is None:
        return "-"
    v = float(value)
    if math.isnan(v):
        return "-"
    return f"{v:.4g}"


def _ranges(values: list[int]) -> str:
    """'0-2', '0,2', '0-2,5,7-9' for sorted distinct integers."""
    parts: list[str] = []
    start: int | None = None
    prev = 0  # read only once start is set (then it is set too)
    for v in values:
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = v
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(parts)


#: ranges shown in a ledger line before the rest are counted (thousands of scattered agents)
MAX_RANGES = 4


def _agents(agents: list[int]) -> str:
    """'owner 3', 'owners 0-2,5': at most MAX_RANGES ranges, then '... (N owners)'."""
    parts = _ranges(agents).split(",")
    if len(parts) > MAX_RANGES:
        return f"owners {','.join(parts[:MAX_RANGES])},... ({len(agents):,} owners)"
    return ("owner " if len(agents) == 1 else "owners ") + ",".join(parts)


def _plain(value: Any) -> Any:
    """A ledger field as a plain Python value (bytes decoded)."""
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8", "replace").rstrip("\x00")
    if isinstance(value, np.generic):
        return value.item()
    return value


def _key(row: dict[str, Any]) -> tuple:
    """Grouping key: every field but the agent, numbers as printed (%.4g: agents whose totals
    differ only in the last bits, e.g. a per-agent ratio sens / scale, share a line)."""
    return tuple(
        (k, _num(v) if isinstance(v, float) else v)
        for k, v in row.items() if k != "agent"
    )


def _ledger_attrs(cfg: ConfigView) -> dict[str, Any]:
    d = cfg.group.get("privacy/ledger")
    if not isinstance(d, h5py.Dataset):
        return {}
    return {k: _plain(v) for k, v in d.attrs.items()}


class _Config:
    """One configuration's ledger, grouped: rows of (agents, field values) in agent order."""

    def __init__(self, cfg: ConfigView) -> None:
        self.index = cfg.index
        self.label = cfg.label
        self.attrs = _ledger_attrs(cfg)
        self.problem: str | None = None
        self.groups: list[tuple[list[int], dict[str, Any]]] = []
        try:
            led = cfg.ledger()
        except (OSError, KeyError, TypeError, ValueError) as exc:  # unreadable: say so, go on
            self.problem = f"privacy ledger unreadable ({exc})"
            return
        if led is None:
            self.problem = NONE_RECORDED
            return
        names = led.dtype.names
        if not names:
            self.problem = "privacy ledger of unknown layout (not a table)"
            return
        led = np.atleast_1d(led)
        if led.size == 0:
            self.problem = "privacy ledger is empty"
            return
        rows = []
        totals = shown_totals(led)  # a no-noise owner's totals: inf, whatever the file says
        no_noise = no_noise_rows(led)
        for i, rec in enumerate(led):
            row = {k: _plain(rec[k]) for k in names}
            row.update((k, float(v[i])) for k, v in totals.items())
            row["agent"] = int(row.get("agent", i))
            if no_noise[i]:
                row[NO_NOISE_KEY] = True
            if "delta" not in row and "delta" in self.attrs:
                row["delta"] = float(self.attrs["delta"])
            rows.append(row)
        rows.sort(key=lambda r: r["agent"])
        keyed: dict[tuple, tuple[list[int], dict[str, Any]]] = {}
        for row in rows:
            entry = keyed.setdefault(_key(row), ([], row))
            entry[0].append(row["agent"])
        self.groups = list(keyed.values())

    @property
    def fields(self) -> set[str]:
        return {k for _, row in self.groups for k in row}


#: the key a row carries (only) when its owner trained without noise: the flag, not a column
NO_NOISE_KEY = "_no_noise"


def _flags(row: dict[str, Any]) -> str:
    flags = ["no noise (eps = inf)"] if row.get(NO_NOISE_KEY) else []
    if "certified" in row and not bool(row["certified"]):
        flags.append("NOT certified")
    dd = int(row.get("data_dependent", 0) or 0)
    if dd > 0:
        flags.append(f"data-dependent calibration ({dd} release{'s' if dd != 1 else ''})")
    return "; ".join(flags)


def _basic(row: dict[str, Any]) -> Any:
    return row["eps_basic"] if "eps_basic" in row else row.get("spent_eps")


def _any_positive(configs: list[_Config], field: str) -> bool:
    for c in configs:
        for _, row in c.groups:
            v = row.get(field)
            if v is not None and not (isinstance(v, float) and math.isnan(v)) and v > 0:
                return True
    return False


def _columns(configs: list[_Config], deltas: set[float]) -> list[tuple[str, Any]]:
    """(heading, row -> cell text) for the columns the file has data for."""
    fields = set().union(*(c.fields for c in configs))
    cols: list[tuple[str, Any]] = [("agents", None)]
    if "mechanism" in fields:
        cols.append(("mechanism", lambda r: str(r.get("mechanism", "-")) or "-"))
    if "releases" in fields:
        cols.append(("releases", lambda r: str(int(r["releases"])) if "releases" in r else "-"))
    if "eps_per_release" in fields:
        cols.append(("eps/release", lambda r: _num(r.get("eps_per_release"))))
    if "noise_multiplier" in fields:
        cols.append(("noise/sens", lambda r: _num(r.get("noise_multiplier"))))
    if _any_positive(configs, "delta_per_release"):
        cols.append(("delta/release", lambda r: _num(r.get("delta_per_release"))))
    if "budget_eps" in fields:
        cols.append(("budget eps", lambda r: _num(r.get("budget_eps"))))
    if _any_positive(configs, "budget_delta"):
        cols.append(("budget delta", lambda r: _num(r.get("budget_delta"))))
    has_totals = any(f in fields for _, f in TOTALS)
    if has_totals:
        cols += [(h, (lambda r, f=f: _num(_basic(r) if f == "eps_basic" else r.get(f))))
                 for h, f in TOTALS]
        if any(_differs(r) for c in configs for _, r in c.groups):
            cols.append(("PLD all", lambda r: _num(r.get("eps_pld_all"))))
        if len(deltas) > 1:
            cols.append(("delta", lambda r: _num(r.get("delta"))))
    elif "spent_eps" in fields:
        cols.append(("spent eps (basic)", lambda r: _num(r.get("spent_eps"))))
        if _any_positive(configs, "spent_delta"):
            cols.append(("spent delta (basic)", lambda r: _num(r.get("spent_delta"))))
    return cols


def _differs(row: dict[str, Any]) -> bool:
    """Whether the plain composition of all releases differs from the scope's total."""
    a, b = row.get("eps_pld_all"), row.get("eps_pld")
    return a is not None and b is not None and _num(a) != _num(b)


#: relative slack of "target met" (the calibration meets the target to 1e-6 at worst)
MET_RTOL = 1e-6


def _text(v: Any) -> str:
    return str(v) if v is not None else "-"


#: more configurations than this: one contract line per group of alike configurations
CONTRACT_LINES_MAX = 12


def contract_lines(configs: list[_Config]) -> list[str]:
    """One line per configuration with a contract: each owner's target, the rule and scope, and
    the achieved totals (the largest over owners): met when every owner's PLD total is at most
    its target. Beyond CONTRACT_LINES_MAX configurations, configurations of equal target, rule,
    scope and verdict share a line (their indices, the largest totals)."""
    lines = _contract_entries(configs)
    if len(lines) > CONTRACT_LINES_MAX:
        groups: dict[tuple, list[tuple]] = {}
        for e in lines:
            groups.setdefault(e[2], []).append(e)
        lines = [(sorted(i for i, *_ in es), "", key, max(e[3] for e in es),
                  max(e[4] for e in es), max(e[5] for e in es), max(e[6] for e in es))
                 for key, es in groups.items()]
    out = []
    for idx, label, (tgt, dl, scopes, rules, verdict), pld, rdp, basic, every in lines:
        which = (f"#{idx} {label}" if isinstance(idx, int) else
                 f"#{_ranges(idx)} ({len(idx)} configurations)")
        extra = f"; all releases composed: PLD {_num(every)}" if every > pld * (1 + 1e-9) else ""
        achieved = f"{pld:.6g}" + (", no noise" if math.isinf(pld) and verdict.startswith(
            f"NOT private: {NO_NOISE}") else "")
        out.append(f"  {which}: target eps={tgt}, delta={dl} per owner and {scopes}, "
                   f"calibration {rules}; achieved PLD {achieved} (RDP {_num(rdp)}, basic "
                   f"{_num(basic)}){extra}: {verdict}")
    if out:
        out.insert(0, "privacy contract (per configuration; achieved: the largest total over "
                      "owners, at each owner's delta):")
    return out


def _contract_entries(configs: list[_Config]) -> list[tuple]:
    """(index, label, (target, delta, scopes, rules, verdict), PLD, RDP, basic, PLD of all
    releases) of every configuration with a contract."""
    out = []
    for c in configs:
        rows = [r for _, r in c.groups]
        if not rows or "target_eps" not in rows[0]:
            continue
        targets = sorted({float(r["target_eps"]) for r in rows})
        deltas = sorted({float(r["target_delta"]) for r in rows})
        rules = sorted({_text(r.get("calibration")) for r in rows})
        scopes = sorted({_text(r.get("scope")) for r in rows})
        every_owner = [{**r, "agent": a} for agents, r in c.groups for a in agents]
        verdict_of: Guarantee = judge_rows(every_owner)
        shown = shown_totals(rows)  # inf for an owner that trained without noise

        pld, rdp, basic = (_most(shown, k) for k in ("eps_pld", "eps_rdp", "eps_basic"))
        tgt = _num(targets[0]) if len(targets) == 1 else f"{_num(targets[0])}..{_num(targets[-1])}"
        dl = _num(deltas[0]) if len(deltas) == 1 else f"{_num(deltas[0])}..{_num(deltas[-1])}"
        verdict = _verdict(rows, rules, verdict_of)
        every = _most(shown, "eps_pld_all" if "eps_pld_all" in shown else "eps_pld")
        out.append((c.index, c.label, (tgt, dl, "/".join(scopes), ", ".join(rules), verdict),
                    pld, rdp, basic, every))
    return out


def _most(shown: dict[str, np.ndarray], field: str) -> float:
    """The largest of a total over owners (NaN when the ledger has no such field)."""
    return float(np.max(shown[field])) if field in shown else math.nan


def _verdict(rows: list[dict[str, Any]], rules: list[str], g: Guarantee) -> str:
    """'met' / 'NOT met' against the target, and 'NOT private: <why>' unless the guarantee is
    finite and certified (a configuration trained without noise: that alone)."""
    if g.without_noise and all(r.startswith(NO_NOISE) for r in g.reasons):
        return f"NOT private: {g.reason}"
    met = all(float(r["eps_pld"]) <= float(r["target_eps"]) * (1 + MET_RTOL) for r in rows)
    verdict = "met" if met else "NOT met"
    if not met and any(x.startswith("paper:") for x in rules):
        verdict += " (the paper's rule reads eps in its own unit)"
    return verdict if g.private else f"{verdict}; NOT private: {g.reason}"


def _notes(configs: list[_Config], attr: str, name: str, skip_if: str | None = None) -> list[str]:
    """'name: text' once per distinct attribute text (with the configurations when it varies)."""
    by_text: dict[str, list[int]] = {}
    with_ledger = [c for c in configs if c.groups]
    for c in with_ledger:
        if skip_if is not None and skip_if in c.attrs:
            continue
        text = c.attrs.get(attr)
        if text is not None and str(text).strip():
            by_text.setdefault(str(text).strip(), []).append(c.index)
    out = []
    for text, idx in by_text.items():
        if len(by_text) == 1 and len(idx) == len(with_ledger):
            out.append(f"{name}: {text}")
        else:
            which = "configuration" if len(idx) == 1 else "configurations"
            out.append(f"{name} ({which} {_ranges(sorted(idx))}): {text}")
    return out


def ledger_text(result: Result) -> str:
    """The per-agent privacy ledgers of every configuration of `result`, as aligned text.

    A heading line naming the accountants (and the delta the totals are at), then one line per group
    of agents with identical ledger rows per configuration: mechanism, releases, eps per release,
    budget, total eps by basic / advanced / PLD / RDP composition (%.4g, 'inf' kept, '-' when not
    recorded), the configuration's index and label (on its first line only) and the flags 'NOT
    certified' / 'data-dependent calibration (N releases)'; then the ledgers' `guarantee` text once
    per distinct text (naming the configurations when it varies). Columns the file has no data for
    are left out. Files without any ledger give 'no privacy ledger recorded'.
    """
    configs = [_Config(c) for c in result.configs]
    recorded = [c for c in configs if c.groups]
    if not recorded:
        problems = {c.problem for c in configs if c.problem and c.problem != NONE_RECORDED}
        return "\n".join([NONE_RECORDED] + sorted(problems))
    deltas = {
        float(row["delta"]) for c in recorded for _, row in c.groups
        if row.get("delta") is not None and not math.isnan(float(row["delta"]))
    }
    fields = set().union(*(c.fields for c in recorded))
    if any(f in fields for _, f in TOTALS):
        if len(deltas) == 1:
            at = f" at delta={next(iter(deltas)):g}"
        elif deltas:
            at = " at each line's delta"
        else:
            at = ""
        head = (f"privacy ledger (per agent; totals{at}): "
                + " | ".join(h for h, _ in TOTALS))
    else:
        head = ("privacy ledger (per agent; basic composition only: this file records no "
                "advanced / PLD / RDP accounting)")
    cols = _columns(recorded, deltas)
    cols.append(("label", None))
    if any(_flags(row) for c in recorded for _, row in c.groups):
        cols.append(("flags", _flags))
    headers = ["#"] + [h for h, _ in cols]
    rows: list[list[str] | tuple[str, str, str]] = []
    for c in configs:
        if not c.groups:  # a configuration without a readable ledger: free text, not aligned
            rows.append((str(c.index), c.problem or NONE_RECORDED, c.label))
            continue
        for j, (agents, row) in enumerate(c.groups):
            cells = [str(c.index) if j == 0 else ""]
            for h, fn in cols:
                if h == "agents":
                    cells.append(_agents(agents))
                elif h == "label":
                    cells.append(c.label if j == 0 else "")
                else:
                    cells.append(fn(row))
            rows.append(cells)
    table = [r for r in rows if isinstance(r, list)]
    lines = iter(aligned(headers, table, {k for k, h in enumerate(headers) if h in _LEFT},
                         rule=False))
    width0 = max([len(headers[0])] + [len(r[0]) for r in table])
    summary = contract_lines(configs)
    out = [*summary, *([""] if summary else []), head, next(lines)]
    for r in rows:
        if isinstance(r, tuple):
            index, problem, label = r
            out.append(f"{index.rjust(width0)}  {problem}  {label}".rstrip())
        else:
            out.append(next(lines))
    out += _notes(recorded, "guarantee", "guarantee")
    out += _notes(recorded, "composition", "composition", skip_if="guarantee")
    return "\n".join(out)
