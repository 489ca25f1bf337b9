"""One meaning of "private" in every view (issue 42): mpi_dp.analysis.guarantee judges whether a
configuration's guarantee is finite and certified, and `export --release`, `analyze`, `compare`
and the ledger table all read a configuration trained without noise as eps = inf.

Real results: a sync_star sweep eps = [1, inf] (its eps = inf ledger records inf totals) and a
p2p sweep eps = [1, inf] (its eps = inf ledger records mechanism none, releases 0 and totals 0,
which no view may show as 0); plus copies of the sync_star result whose eps = inf ledger is
rewritten to p2p's style ("styled"), or to that of a configuration that released nothing under a
finite target ("silent", an old p2p admm baseline), so that the star views are checked on such
ledgers too."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from helpers import write_job
from mpi4py import MPI

from mpi_dp import cli, strict_json
from mpi_dp.analysis import guarantee
from mpi_dp.analysis.guarantee import judge_rows, shown_totals
from mpi_dp.analysis.load import open_result
from mpi_dp.analysis.privacy_text import ledger_text
from mpi_dp.privacy.accountants import LEDGER_DTYPE

TOTALS = ("eps_basic", "eps_advanced", "eps_pld", "eps_rdp", "eps_basic_all", "eps_pld_all",
          "eps_rdp_all")


def _rows(n: int = 3, eps: float = 1.0, **fields) -> np.ndarray:
    """n owners, a finite, certified guarantee (3 Laplace releases calibrated to eps), with
    `fields` overriding columns (a scalar for all owners, or one value per owner)."""
    led = np.zeros(n, dtype=LEDGER_DTYPE)
    led["agent"] = np.arange(n)
    led["mechanism"], led["releases"], led["eps_per_release"] = b"laplace", 3, eps / 3
    led["noise_multiplier"] = 3 / eps
    led["target_eps"], led["target_delta"], led["delta"] = eps, 1e-5, 1e-5
    led["calibration"], led["scope"], led["certified"] = b"pld", b"configuration", True
    for k in TOTALS:
        led[k] = eps * (0.999 if "pld" in k else 1.2)
    for k, v in fields.items():
        led[k] = v
    return led


def _p2p_no_noise(n: int = 3) -> np.ndarray:
    """What p2p writes at eps = inf: mechanism none, releases 0, every total 0, certified."""
    zero = {k: 0.0 for k in TOTALS}
    return _rows(n, mechanism=b"none", releases=0, eps_per_release=0.0, target_eps=math.inf,
                 noise_multiplier=math.nan, **zero)


# -- the rule -----------------------------------------------------------------------------------

def test_a_finite_certified_ledger_is_private():
    g = judge_rows(_rows(eps=2.0))
    assert g.private and not g.reasons and g.reason == ""
    assert g.eps == pytest.approx(2.0 * 0.999) and not g.without_noise


def test_a_p2p_style_no_noise_row_is_not_private():
    """mechanism none, releases 0, eps_pld 0, target_eps inf, certified: eps = inf, never 0."""
    rows = _p2p_no_noise()
    g = judge_rows(rows)
    assert not g.private and g.eps == math.inf and g.without_noise
    assert g.reason.startswith("eps = inf: trained without noise (owners 0-2: target eps = inf")
    assert g.eps_text == "inf (no noise)"
    shown = shown_totals(rows)
    assert all(np.all(np.isposinf(shown[k])) for k in TOTALS)
    # one owner without noise is enough: the configuration's eps is inf
    mixed = np.concatenate([_rows(2), _p2p_no_noise(1)])
    mixed["agent"] = np.arange(3)
    g = judge_rows(mixed)
    assert not g.private and g.eps == math.inf and g.no_noise.tolist() == [False, False, True]
    assert "owner 2: target eps = inf" in g.reason


def test_no_noisy_release_anywhere_is_eps_inf_even_under_a_finite_target():
    """An old p2p admm baseline: a finite target, but no owner released anything with noise."""
    rows = _p2p_no_noise()
    rows["target_eps"] = 1.0
    g = judge_rows(rows)
    assert not g.private and g.eps == math.inf
    assert "no owner made a noisy release" in g.reason


def test_one_silent_owner_among_releasing_ones_is_not_private_but_keeps_its_total():
    rows = _rows(3)
    rows["mechanism"][2], rows["releases"][2] = b"none", 0
    for k in TOTALS:
        rows[k][2] = 0.0
    g = judge_rows(rows)
    assert not g.private and math.isfinite(g.eps) and not g.without_noise
    assert g.reason.startswith("uncertified: owner 2 recorded no noisy release")
    assert shown_totals(rows)["eps_pld"][2] == 0.0  # nothing altered: not a no-noise row


@pytest.mark.parametrize("fields, why", [
    ({"certified": [True, False, True]}, "uncertified: owner 1: noise not the mechanism"),
    ({"data_dependent": [0, 0, 4]}, "uncertified: owner 2: noise calibrated from private data"),
    ({"eps_pld": [0.9, math.nan, math.inf]}, "no finite total: owners 1-2: eps_pld = inf/nan"),
    ({"eps_pld": 0.0}, "uncertified: owners 0-2: eps_pld 0 after noisy releases"),
    ({"target_eps": math.nan}, "uncertified: owners 0-2: target eps unknown"),
])
def test_what_breaks_the_guarantee_is_said(fields, why):
    g = judge_rows(_rows(**fields))
    assert not g.private and why in g.reason, g.reason


def test_a_total_above_its_target_is_still_a_finite_certified_guarantee():
    g = judge_rows(_rows(eps=1.0, eps_pld=12.5))  # the paper's rule: NOT met, but DP at 12.5
    assert g.private and g.eps == 12.5


def test_no_ledger_or_a_ledger_without_a_contract_is_not_private(tmp_path):
    assert judge_rows(None).reason.startswith("no ledger")
    assert judge_rows(_rows(0)).reason.startswith("no ledger")
    old = np.zeros(2, dtype=[("agent", "i8"), ("mechanism", "S8"), ("releases", "i8"),
                             ("spent_eps", "f8")])
    old["mechanism"], old["releases"], old["spent_eps"] = b"laplace", 5, 0.5
    g = judge_rows(old)
    assert not g.private and "no target_eps, eps_pld, certified" in g.reason and g.eps == 0.5
    with h5py.File(tmp_path / "g.h5", "w") as f:  # the per-field columns serve as the ledger
        assert judge_rows(None).private is False and not guarantee.judge_group(f).private
        for k in LEDGER_DTYPE.names:
            f.create_dataset(f"ledger/{k}", data=_p2p_no_noise()[k])
        g = guarantee.judge_group(f)
        assert not g.private and g.eps == math.inf


# -- real results -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def results(tmp_path_factory, small_shards, method_shards) -> dict[str, Path]:
    """sync_star and p2p sweeps over eps = [1, inf] (in-process), and copies of the sync_star
    one whose eps = inf ledger is p2p's (mechanism none, releases 0, totals 0) under target
    eps = inf ("styled") or 1 ("silent")."""
    from mpi_dp.runner import run_job

    d = tmp_path_factory.mktemp("guarantee")
    sync = write_job(d / "sync.toml", small_shards, T=6, runs=2, record_every=2,
                     sweep={"eps": [1.0, math.inf]})
    p2p = write_job(d / "p2p.toml", method_shards["p2p"], algorithm="p2p", T=16 * 8, runs=2,
                    record_every=64, sweep={"eps": [1.0, math.inf]})
    out = {k: Path(run_job(j, comm=MPI.COMM_SELF, progress=False))
           for k, j in (("sync", sync), ("p2p", p2p))}
    for name, target in (("styled", math.inf), ("silent", 1.0)):
        out[name] = Path(shutil.copyfile(out["sync"], d / f"sync_{name}.h5"))
        with h5py.File(out[name], "r+") as f:
            led = f["configs/001/privacy/ledger"]
            rows = _p2p_no_noise(len(led))
            rows["target_eps"] = target
            led[...] = rows
            for k in LEDGER_DTYPE.names:
                f[f"configs/001/ledger/{k}"][...] = rows[k]
    return out


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("which, model", [("sync", "models/final"), ("p2p", "models/theta"),
                                          ("styled", "models/final"),
                                          ("silent", "models/final")])
def test_the_release_leaves_out_the_models_of_a_no_noise_configuration(
        results, tmp_path, capsys, which, model):
    src = shutil.copyfile(results[which], tmp_path / "r.h5")
    rc, out, err = _cli(capsys, "export", str(src), "--release")
    assert rc == 0, err
    rel = tmp_path / "r.release.h5"
    assert "left out: 1 configuration(s) without a finite, certified DP guarantee" in out
    assert "#1 (" in out and "): eps = inf: trained without noise" in out and "#0 (" not in out
    with h5py.File(src, "r") as s, h5py.File(rel, "r") as r:
        # the eps = 1 configuration keeps its noisy model, bit for bit
        assert r[f"configs/000/{model}"][()].tobytes() == s[f"configs/000/{model}"][()].tobytes()
        # the eps = inf one: no model, no value but what states the guarantee; its attributes stay
        g = r["configs/001"]
        assert model not in g and "models" not in g
        kept = []
        g.visititems(lambda n, o: kept.append(n) if isinstance(o, h5py.Dataset) else None)
        assert kept and all(n in ("privacy/ledger", "eps", "agent") or n.startswith("ledger/")
                            for n in kept), kept
        assert g["privacy/ledger"][()].tobytes() == s["configs/001/privacy/ledger"][()].tobytes()
        assert g.attrs["label"] == s["configs/001"].attrs["label"]
        listed = strict_json.loads(r.attrs["release_nonprivate"])
        assert [e["config"] for e in listed] == [1] and listed[0]["eps"] == math.inf
        assert listed[0]["reason"].startswith("eps = inf: trained without noise (")
        assert f"/configs/001/{model}" in listed[0]["left_out"] and not listed[0]["included"]
        removed = json.loads(r.attrs["release_removed"])
        assert f"/configs/001/{model}" in removed["nonprivate"]
        assert f"/configs/001/{model}" in removed["datasets"]
        assert "release_warning" not in r.attrs
        assert "without a finite, certified DP guarantee" in r.attrs["release_note"]


def test_include_nonprivate_keeps_them_with_a_warning(results, tmp_path, capsys):
    src = shutil.copyfile(results["p2p"], tmp_path / "r.h5")
    rel = tmp_path / "all.h5"
    rc, out, err = _cli(capsys, "export", str(src), "--release", "--include-nonprivate",
                        "--out", str(rel))
    assert rc == 0, err
    assert "WARNING" in err and "without a finite, certified DP guarantee" in err and "#1 (" in err
    with h5py.File(src, "r") as s, h5py.File(rel, "r") as r:
        assert r["configs/001/models/theta"][()].tobytes() == \
            s["configs/001/models/theta"][()].tobytes()
        warning = r.attrs["release_warning"]
        assert warning.startswith("contains models of configurations without a finite, "
                                  "certified DP guarantee: #1 (")
        listed = strict_json.loads(r.attrs["release_nonprivate"])
        assert listed[0]["included"] and listed[0]["left_out"] == []
        assert "WARNING" in r.attrs["release_note"]
    rc, _, err = _cli(capsys, "export", str(src), "--include-nonprivate", "--out",
                      str(tmp_path / "t.csv"))
    assert rc == 2 and "--include-nonprivate applies to --release only" in err


def test_a_release_of_private_configurations_only_lists_none(results, tmp_path, capsys):
    src = shutil.copyfile(results["sync"], tmp_path / "r.h5")
    with h5py.File(src, "r+") as f:  # drop the eps = inf configuration
        del f["configs/001"]
    rc, out, err = _cli(capsys, "export", str(src), "--release", "--include-nonprivate")
    assert rc == 0, err
    assert "left out" not in out and "WARNING" not in err
    with h5py.File(tmp_path / "r.release.h5", "r") as r:
        assert strict_json.loads(r.attrs["release_nonprivate"]) == []
        assert "release_warning" not in r.attrs and "configs/000/models/final" in r


def test_help_teaches_the_left_out_configurations_and_include_nonprivate(capsys):
    with pytest.raises(SystemExit):
        cli.main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for piece in ("--include-nonprivate", "release_warning", "release_nonprivate",
                  "without a finite, certified DP guarantee"):
        assert piece in text, piece


def _cell(text: str, header_start: str, row_start: str, column: str) -> str:
    """The right-aligned cell of `column` in the ledger row starting with `row_start`."""
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.startswith(header_start))
    row = next(ln for ln in lines if ln.startswith(row_start))
    end = header.index(f" {column}") + 1 + len(column)
    return row[:end].split()[-1]


@pytest.mark.parametrize("which", ["p2p", "styled", "silent", "sync"])
def test_analyze_reads_a_no_noise_configuration_as_eps_inf(results, capsys, which):
    with open_result(results[which]) as res:
        text = ledger_text(res)
    if which != "silent":  # a contract line: target eps = inf
        line = next(ln for ln in text.splitlines() if ln.startswith("  #1 "))
        assert "achieved PLD inf, no noise" in line and "achieved PLD 0" not in line
        assert "NOT private: eps = inf: trained without noise" in line
    else:
        line = next(ln for ln in text.splitlines() if ln.startswith("  #1 "))
        assert "achieved PLD inf, no noise" in line
        assert "NOT private: eps = inf: trained without noise (no owner made a noisy release" \
            in line
    first = next(ln for ln in text.splitlines() if ln.startswith("  #0 "))
    assert first.endswith(": met") and "NOT private" not in first
    row = next(ln for ln in text.splitlines() if ln.startswith("1  "))
    assert row.rstrip().endswith("no noise (eps = inf)")
    for column in ("basic", "advanced", "PLD", "RDP"):
        assert _cell(text, "#  agents", "1  ", column) == "inf", column
        assert _cell(text, "#  agents", "0  ", column) not in ("inf", "0"), column
    rc, out, err = _cli(capsys, "analyze", str(results[which]))
    assert rc == 0, err
    assert "achieved PLD inf, no noise" in out


@pytest.mark.parametrize("which", ["styled", "silent", "p2p"])
def test_compare_shows_inf_for_a_no_noise_configuration(results, capsys, tmp_path, which):
    rc, out, err = _cli(capsys, "compare", str(results[which]), "--out",
                        str(tmp_path / "c.png"))
    assert rc == 0, err
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("file "))
    cols = lines[head].split()
    rows = [ln.split() for ln in lines[head + 2:head + 4]]
    eps = {int(r[1]): r[cols.index("eps")] for r in rows}
    assert eps[1] == "inf" and eps[0] not in ("inf", "0") and float(eps[0]) <= 1.0


@pytest.mark.parametrize("which", ["styled", "silent"])
def test_the_ledger_table_gives_inf_for_no_noise_rows_only(results, tmp_path, capsys, which):
    src = shutil.copyfile(results[which], tmp_path / "r.h5")
    rc, _, err = _cli(capsys, "export", str(src))
    assert rc == 0, err
    led = pd.read_csv(tmp_path / "r.ledger.csv")
    with h5py.File(src, "r") as f:
        raw = [f[f"configs/{i:03d}/privacy/ledger"][()] for i in range(2)]
    for i, table in enumerate(raw):
        got = led[led["config"] == i]
        for k in TOTALS:
            want = np.full(len(table), np.inf) if i == 1 else table[k]
            assert np.array_equal(got[k].to_numpy(dtype=float), want), (i, k)
        # the other fields are the file's (releases 0, mechanism none stay as recorded)
        assert np.array_equal(got["releases"].to_numpy(), table["releases"])
        assert np.array_equal(got["target_eps"].to_numpy(dtype=float), table["target_eps"])
        assert [str(m) for m in got["mechanism"]] == [m.decode() for m in table["mechanism"]]
    assert np.all(raw[1]["eps_pld"] == 0.0)  # the file itself is not altered
