"""Tests for mpi_dp.analysis.privacy_text.ledger_text on hand-built result files (h5py only)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpi_dp.analysis.load import open_result
from mpi_dp.analysis.privacy_text import ledger_text

NEW_DTYPE = np.dtype([
    ("agent", "i8"), ("mechanism", "S16"), ("releases", "i8"), ("eps_per_release", "f8"),
    ("delta_per_release", "f8"), ("budget_eps", "f8"), ("budget_delta", "f8"),
    ("spent_eps", "f8"), ("spent_delta", "f8"), ("eps_basic", "f8"), ("eps_advanced", "f8"),
    ("eps_pld", "f8"), ("eps_rdp", "f8"), ("delta", "f8"), ("data_dependent", "i8"),
    ("certified", "?"),
])
OLD_DTYPE = np.dtype([
    ("agent", "i8"), ("budget_eps", "f8"), ("spent_eps", "f8"), ("budget_delta", "f8"),
    ("spent_delta", "f8"), ("releases", "i8"),
])
GUARANTEE = ("per iteration: each release is eps_bar-DP (the paper's statement); totals compose "
             "all releases")
DELTA = 1e-5


def _new_row(agent: int, *, mech: str = "laplace", releases: int = 201, per: float = 0.004975,
             budget: float = 1.0, basic: float = 0.999975, adv: float = 0.3123456,
             pld: float = 0.2345678, rdp: float = 0.26789, dd: int = 0,
             certified: bool = True) -> tuple:
    return (agent, mech.encode(), releases, per, 0.0, budget, 0.0, basic, 0.0, basic, adv, pld,
            rdp, DELTA, dd, certified)


def _root(f: h5py.File, algorithm: str, sweep: dict | None) -> None:
    f.attrs["format"] = "mpi_dp.results"
    f.attrs["format_version"] = 1
    f.attrs["algorithm"] = algorithm
    f.attrs["status"] = "complete"
    f.attrs["job"] = f'name = "ledger-test"\nalgorithm = "{algorithm}"\n'
    f.attrs["sweep"] = json.dumps(sweep or {})


def _config(g: h5py.Group, index: int, label: str, n_agents: int,
            ledger: np.ndarray | None, attrs: dict | None = None) -> None:
    g.attrs["config_index"] = index
    g.attrs["label"] = label
    g.attrs["eps"] = np.ones(n_agents)
    g.attrs["n"] = np.full(n_agents, 100)
    if ledger is not None:
        d = g.require_group("privacy").create_dataset("ledger", data=ledger)
        for k, v in (attrs or {}).items():
            d.attrs[k] = v


def write_sweep(path: Path, ledgers: list[tuple[str, np.ndarray | None, dict | None]],
                algorithm: str = "admm") -> Path:
    with h5py.File(path, "w") as f:
        _root(f, algorithm, {"eps_bar": [0.1, 1.0]})
        for i, (label, led, attrs) in enumerate(ledgers):
            g = f.require_group("configs").create_group(f"{i:03d}")
            _config(g, i, label, 3 if led is None else len(led), led, attrs)
    return path


def write_single(path: Path, led: np.ndarray | None, attrs: dict | None = None,
                 algorithm: str = "sync_star") -> Path:
    with h5py.File(path, "w") as f:
        _root(f, algorithm, None)
        _config(f, 0, "eps=1 n=100", 3 if led is None else len(led), led, attrs)
    return path


def _text(path: Path) -> str:
    with open_result(path) as r:
        return ledger_text(r)


def _line(text: str, start: str) -> str:
    """The one line whose content (after the config column) starts with `start`."""
    hits = [ln for ln in text.splitlines() if ln.lstrip(" 0123456789").startswith(start)]
    assert len(hits) == 1, (start, text)
    return hits[0]


def _cells(line: str) -> list[str]:
    return line.split()


# --------------------------------------------------------------------------------- new layout


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    attrs = {"guarantee": GUARANTEE, "delta": DELTA}
    c0 = np.array([_new_row(0), _new_row(1), _new_row(2)], dtype=NEW_DTYPE)
    # agents 0 and 2 alike, agent 1 Gaussian with a data-dependent calibration, not certified
    c1 = np.array([
        _new_row(0, per=0.04975, budget=10.0, basic=9.99975, adv=3.0, pld=2.5, rdp=2.75),
        _new_row(1, mech="gaussian", per=0.5, budget=math.inf, basic=100.5, adv=math.inf,
                 pld=12.34567, rdp=15.0, dd=201, certified=False),
        _new_row(2, per=0.04975, budget=10.0, basic=9.99975, adv=3.0, pld=2.5, rdp=2.75),
    ], dtype=NEW_DTYPE)
    # agent 3's row differs from 0-2 only in the PLD total: it must get its own line
    c2 = np.array([_new_row(0), _new_row(1), _new_row(2), _new_row(3, pld=0.2345)],
                  dtype=NEW_DTYPE)
    return write_sweep(tmp_path / "sweep.h5", [("objt eps=0.005", c0, attrs),
                                                ("objp eps=0.05", c1, attrs),
                                                ("outp four", c2, attrs)])


def test_heading_names_accountants_and_delta(sweep: Path) -> None:
    lines = _text(sweep).splitlines()
    assert lines[0] == ("privacy ledger (per agent; totals at delta=1e-05): "
                        "basic | advanced | PLD | RDP")
    assert _cells(lines[1]) == ["#", "agents", "mechanism", "releases", "eps/release",
                                "budget", "eps", "basic", "advanced", "PLD", "RDP", "label",
                                "flags"]


def test_identical_agents_share_a_line(sweep: Path) -> None:
    text = _text(sweep)
    body = text.splitlines()[2:]
    # config 0: one line for all three owners, exact %.4g totals
    assert _cells(body[0]) == ["0", "owners", "0-2", "laplace", "201", "0.004975", "1", "1",
                               "0.3123", "0.2346", "0.2679", "objt", "eps=0.005"]
    # config 1: owners 0 and 2 together (not contiguous), owner 1 alone
    assert _cells(body[1]) == ["1", "owners", "0,2", "laplace", "201", "0.04975", "10", "10",
                               "3", "2.5", "2.75", "objp", "eps=0.05"]
    assert _cells(body[2])[:11] == ["owner", "1", "gaussian", "201", "0.5", "inf", "100.5",
                                    "inf", "12.35", "15", "NOT"]
    # config 2: owner 3 differs (PLD 0.2345 vs 0.2346) and is not merged into 0-2
    assert _cells(body[3])[:3] == ["2", "owners", "0-2"]
    assert _cells(body[4])[:10] == ["owner", "3", "laplace", "201", "0.004975", "1", "1",
                                    "0.3123", "0.2345", "0.2679"]
    assert len(body) == 6 and body[5] == f"guarantee: {GUARANTEE}"


def test_flags_and_inf(sweep: Path) -> None:
    text = _text(sweep)
    flagged = _line(text, "owner 1 ")
    assert flagged.rstrip().endswith(
        "NOT certified; data-dependent calibration (201 releases)"
    )
    assert " inf " in flagged
    for ln in text.splitlines()[2:6]:
        if ln is not flagged and "owner 1 " not in ln:
            assert "NOT certified" not in ln and "data-dependent" not in ln


def test_columns_are_aligned(sweep: Path) -> None:
    lines = _text(sweep).splitlines()
    header = lines[1]
    for ln in lines[2:6]:
        # right-aligned numeric columns end where their heading ends
        for head in ("releases", "eps/release", "basic", "advanced", "PLD", "RDP"):
            end = header.index(head) + len(head)
            assert ln[end - 1] != " " and ln[end] == " ", (head, ln)


def test_guarantee_once_per_distinct_text(tmp_path: Path) -> None:
    led = np.array([_new_row(0), _new_row(1)], dtype=NEW_DTYPE)
    path = write_sweep(tmp_path / "g.h5", [
        ("a", led, {"guarantee": "text one"}), ("b", led, {"guarantee": "text one"}),
        ("c", led, {"guarantee": "text two"}),
    ])
    text = _text(path)
    assert text.count("text one") == 1 and text.count("text two") == 1
    assert "guarantee (configurations 0-1): text one" in text
    assert "guarantee (configuration 2): text two" in text


def test_single_data_dependent_release_and_certified_default(tmp_path: Path) -> None:
    led = np.array([_new_row(0, dd=1), _new_row(1, dd=1)], dtype=NEW_DTYPE)
    text = _text(write_single(tmp_path / "one.h5", led))
    line = _line(text, "owners 0-1")
    assert line.endswith("eps=1 n=100  data-dependent calibration (1 release)")
    assert "NOT certified" not in text and "guarantee" not in text


def test_delta_from_attribute_when_rows_disagree(tmp_path: Path) -> None:
    a = np.array([_new_row(0)], dtype=NEW_DTYPE)
    b = np.array([_new_row(0)], dtype=NEW_DTYPE)
    b["delta"] = 1e-6
    text = _text(write_sweep(tmp_path / "d.h5", [("a", a, None), ("b", b, None)]))
    assert text.splitlines()[0].startswith("privacy ledger (per agent; totals at each line's delta)")
    assert text.splitlines()[1].split()[-2:] == ["delta", "label"]
    assert _cells(text.splitlines()[3])[-2:] == ["1e-06", "b"]


# --------------------------------------------------------------------------------- old layouts


def test_old_dtype_shows_basic_totals(tmp_path: Path) -> None:
    led = np.array([(0, 1.0, 0.5, 0.0, 0.0, 50), (1, 1.0, 0.5, 0.0, 0.0, 50),
                    (2, 2.0, 1.23456, 0.0, 0.0, 50)], dtype=OLD_DTYPE)
    path = write_single(tmp_path / "old.h5", led,
                        {"composition": "basic (sequential); the largest spend over runs"})
    lines = _text(path).splitlines()
    assert lines[0].startswith("privacy ledger (per agent; basic composition only")
    assert _cells(lines[1]) == ["#", "agents", "releases", "budget", "eps", "spent", "eps",
                                "(basic)", "label"]
    assert _cells(lines[2]) == ["0", "owners", "0-1", "50", "1", "0.5", "eps=1", "n=100"]
    assert _cells(lines[3]) == ["owner", "2", "50", "2", "1.235"]
    assert lines[4] == "composition: basic (sequential); the largest spend over runs"
    assert len(lines) == 5
    assert "PLD" not in "\n".join(lines[1:])


def test_old_dtype_spent_delta_shown_when_used(tmp_path: Path) -> None:
    led = np.array([(0, 1.0, 0.5, 1e-5, 5e-6, 50)], dtype=OLD_DTYPE)
    lines = _text(write_single(tmp_path / "oldd.h5", led)).splitlines()
    assert "budget delta" in lines[1] and "spent delta (basic)" in lines[1]
    assert _cells(lines[2])[:7] == ["0", "owner", "0", "50", "1", "1e-05", "0.5"]
    assert _cells(lines[2])[7] == "5e-06"


def test_no_ledger(tmp_path: Path) -> None:
    assert _text(write_single(tmp_path / "none.h5", None)) == "no privacy ledger recorded"
    path = write_sweep(tmp_path / "none_sweep.h5", [("a", None, None), ("b", None, None)])
    assert _text(path) == "no privacy ledger recorded"


def test_some_configurations_without_ledger(tmp_path: Path) -> None:
    led = np.array([_new_row(0), _new_row(1)], dtype=NEW_DTYPE)
    path = write_sweep(tmp_path / "mixed.h5", [("with", led, None), ("without", None, None)])
    lines = _text(path).splitlines()
    assert _cells(lines[2])[:3] == ["0", "owners", "0-1"]
    assert lines[3].split() == ["1", "no", "privacy", "ledger", "recorded", "without"]


def test_unknown_layout_does_not_crash(tmp_path: Path) -> None:
    path = write_single(tmp_path / "plain.h5", np.zeros(3))
    assert _text(path).startswith("no privacy ledger recorded")


def test_rows_stored_out_of_agent_order(tmp_path: Path) -> None:
    led = np.array([_new_row(3, pld=0.5), _new_row(1), _new_row(2, pld=0.5), _new_row(0)],
                   dtype=NEW_DTYPE)
    lines = _text(write_single(tmp_path / "order.h5", led)).splitlines()
    assert _cells(lines[2])[:4] == ["0", "owners", "0-1", "laplace"]
    assert _cells(lines[2])[9] == "0.2346"
    assert _cells(lines[3])[:3] == ["owners", "2-3", "laplace"]
    assert _cells(lines[3])[8] == "0.5"


def test_agents_differing_below_the_printed_digits_share_a_line(tmp_path: Path) -> None:
    """A per-agent ratio sens / scale makes totals differ in the last bits: one line for both,
    while a difference that shows in %.4g keeps its own line."""
    led = np.array([_new_row(0, pld=0.2345678), _new_row(1, pld=0.2345678 * (1 + 1e-15)),
                    _new_row(2, pld=0.2351)], dtype=NEW_DTYPE)
    text = _text(write_single(tmp_path / "ulp.h5", led))
    assert "0.2346" in _cells(_line(text, "owners 0-1")) and "0.2351" in _cells(
        _line(text, "owner 2"))


def test_scattered_agents_are_counted_not_listed() -> None:
    """Thousands of agents with equal ledgers but scattered ids (p2p: releases vary by peer)
    make one short cell: the first ranges, then the count."""
    from mpi_dp.analysis.privacy_text import MAX_RANGES, _agents

    assert _agents([1]) == "owner 1" and _agents([0, 1, 2, 5]) == "owners 0-2,5"
    ids = list(range(0, 20000, 2))
    cell = _agents(ids)
    assert cell == "owners 0,2,4,6,... (10,000 owners)" and MAX_RANGES == 4
    assert _agents(list(range(0, 8, 2))) == "owners 0,2,4,6"
