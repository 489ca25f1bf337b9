"""A job's start (issue 44): the noise calibration is cached on disk across jobs
(privacy.calibration_store), so a second job with the same plan reads the same bits with no
search and no dp-accounting; what `mpi-dp run` imports before its first iteration leaves out
what it does not use (pandas, matplotlib, dp-accounting, the data commands' modules)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import HANG_GUARD_S, write_job

from mpi_dp.privacy import accountants, calibration, calibration_cost
from mpi_dp.privacy.calibration import Plan
from mpi_dp.privacy.events import GaussianEvent, LaplaceEvent

ROOT = Path(__file__).resolve().parent.parent
#: the cache's folder ('auto', 'off' or a folder), and the root of mpi_dp's caches
ENV, ROOT_ENV = "MPI_DP_CALIBRATION_CACHE", "MPI_DP_CACHE"


@pytest.fixture()
def disk(tmp_path, monkeypatch) -> Path:
    """The calibration cache in a fresh folder, and no calibration known in this process."""
    folder = tmp_path / "calibration"
    monkeypatch.setenv(ENV, str(folder))
    monkeypatch.setattr(calibration, "_CACHE", {})
    monkeypatch.setattr(accountants, "_CACHE", {})
    return folder


def _forget(monkeypatch) -> None:
    """A new job: nothing known in this process (the disk cache stays)."""
    monkeypatch.setattr(calibration, "_CACHE", {})
    monkeypatch.setattr(accountants, "_CACHE", {})


def _no_accountant(monkeypatch) -> None:
    """Every composition fails: a calibration that searches raises."""
    def refuse(*_a, **_k):
        raise AssertionError("the calibration searched: not read from the disk cache")
    for name in ("pld", "rdp", "compose"):
        monkeypatch.setattr(accountants, name, refuse)


def _entries(folder: Path, rule: str) -> list[Path]:
    """The disk cache's entries of `rule` ('pld', 'basic', or 'totals': accountants' totals)."""
    return [e for e in sorted(folder.glob("*.json"))
            if json.loads(e.read_text())["key"]["rule"] == rule]


def _bits(cal: calibration.Calibration) -> tuple:
    assert cal.planned is not None
    return (cal.noise_multiplier.hex(),
            tuple(float(v).hex() for v in vars(cal.planned).values()))


PLANS = [Plan("laplace", 200, 1.0, 1e-4),
         Plan("laplace", 50, 2.0, 1e-5, fixed=(LaplaceEvent(1.0, 4.0), LaplaceEvent(1.0, 4.0))),
         Plan("gaussian", 100, 0.5, 1e-5, fixed=(GaussianEvent(1.0, 30.0, 1e-6),),
              scope="record")]


@pytest.mark.parametrize("rule", ["pld", "basic"])
@pytest.mark.parametrize("plan", PLANS, ids=["laplace", "fixed", "gaussian"])
def test_a_later_job_reads_the_calibration_from_disk_bit_for_bit(disk, monkeypatch, plan, rule):
    fresh = calibration.calibrate(plan, rule)
    assert len(_entries(disk, rule)) == 1
    _forget(monkeypatch)
    assert calibration.cached(plan, rule)  # the estimate sees it: it costs nothing
    _forget(monkeypatch)
    assert calibration_cost.plan_cost(plan, rule) == calibration_cost.Cost()
    _forget(monkeypatch)
    _no_accountant(monkeypatch)
    before = calibration.evaluations()
    again = calibration.calibrate(plan, rule)
    assert calibration.evaluations() == before
    assert again == fresh and _bits(again) == _bits(fresh)
    assert again.text() == fresh.text()


def test_a_later_job_reads_a_compositions_totals_from_disk_bit_for_bit(disk, monkeypatch):
    """accountants' totals of a composition that needs dp-accounting (a ledger's, at the end of
    a configuration) are stored by their exact signature and read back without composing;
    trivial and exact-regime ones are not stored; another delta or count misses."""
    pairs = [(LaplaceEvent(0.5, 37.0), 120), (GaussianEvent(1.0, 9.0, 1e-7), 3)]
    fresh = accountants.compose(pairs, 1e-5)
    assert len(_entries(disk, "totals")) == 1
    accountants.compose([(LaplaceEvent(1.0, 0.0), 5)], 1e-5)  # no noise: inf, nothing stored
    accountants.compose([(LaplaceEvent(1.0, 1e-3), 5)], 1e-5)  # eps 1000 per release: exact
    assert len(_entries(disk, "totals")) == 1
    _forget(monkeypatch)
    _no_accountant(monkeypatch)
    monkeypatch.setattr(accountants, "compose", lambda p, d: accountants._totals(
        *accountants._signature(p, d)))
    again = accountants.compose(pairs, 1e-5)
    assert [float(v).hex() for v in vars(again).values()] == \
        [float(v).hex() for v in vars(fresh).values()]
    for other in ([(LaplaceEvent(0.5, 37.0), 121), pairs[1]], pairs):
        _forget(monkeypatch)
        with pytest.raises(AssertionError, match="searched"):
            accountants.compose(other, 1e-6 if other is pairs else 1e-5)


def test_another_plan_rule_or_version_misses(disk, monkeypatch):
    from mpi_dp.privacy import calibration_store

    plan = PLANS[1]
    calibration.calibrate(plan, "pld")
    others = [Plan("laplace", 50, 2.0 + 2**-51, 1e-5, fixed=plan.fixed),  # one ulp of eps
              Plan("laplace", 51, 2.0, 1e-5, fixed=plan.fixed),
              Plan("laplace", 50, 2.0, 1e-5, fixed=plan.fixed, scope="record"),
              Plan("laplace", 50, 2.0, 1e-5, fixed=(LaplaceEvent(1.0, 4.0),)),
              Plan("laplace", 50, 2.0, 1e-5, fixed=(LaplaceEvent(1.0, 4.0),
                                                   LaplaceEvent(1.0, 4.0, certified=False)))]
    _forget(monkeypatch)
    assert calibration.cached(plan, "pld")
    assert not calibration.cached(plan, "basic")
    for other in others:
        assert other != plan and not calibration.cached(other, "pld"), other
    env = calibration_store.environment()
    for key, value in [("dp-accounting", "0.0.1"), ("code_version", "0"), ("scipy", "0.1")]:
        monkeypatch.setattr(calibration_store, "environment", lambda k=key, v=value: {**env, k: v})
        _forget(monkeypatch)
        assert not calibration.cached(plan, "pld"), key
    monkeypatch.setattr(calibration_store, "environment", lambda: env)
    _forget(monkeypatch)
    assert calibration.cached(plan, "pld")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "other_key", "bad_value",
                                    "zero_noise"])
def test_a_damaged_entry_is_ignored_and_recomputed(disk, monkeypatch, damage):
    plan = PLANS[0]
    fresh = calibration.calibrate(plan, "pld")
    [entry] = _entries(disk, "pld")
    text = entry.read_text()
    data = json.loads(text)
    if damage == "garbage":
        entry.write_bytes(b"\x00\xff\xfe not json")
    elif damage == "truncated":
        entry.write_text(text[: len(text) // 2])
    elif damage == "empty":
        entry.write_text("")
    elif damage == "other_key":  # an entry of another plan under this name
        data["key"]["plan"]["fields"]["releases"] = {"int": 201}
        entry.write_text(json.dumps(data))
    elif damage == "bad_value":
        data["value"]["noise_multiplier"] = {"nm": 44.7}
        entry.write_text(json.dumps(data))
    else:
        data["value"]["noise_multiplier"] = {"nm": (0.0).hex()}
        entry.write_text(json.dumps(data))
    _forget(monkeypatch)
    assert not calibration.cached(plan, "pld")
    before = calibration.evaluations()
    again = calibration.calibrate(plan, "pld")  # no exception: searched again
    assert calibration.evaluations() > before
    assert _bits(again) == _bits(fresh)
    assert json.loads(entry.read_text()) == json.loads(text)  # rewritten whole


def test_the_environment_variable_places_or_disables_the_cache(tmp_path, monkeypatch):
    """Off in the suite (conftest.py: its jobs search afresh, never into ~/.cache); 'auto' is
    $MPI_DP_CACHE/calibration, else ~/.cache/mpi_dp/calibration; 'off' writes nothing; a folder
    that cannot be written costs only the search."""
    from mpi_dp.privacy import calibration_store

    assert os.environ[ENV] == "off" and calibration_store.folder() is None
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv(ROOT_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert calibration_store.folder() == tmp_path / "home" / ".cache" / "mpi_dp" / "calibration"
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "root"))
    assert calibration_store.folder() == tmp_path / "root" / "calibration"
    monkeypatch.setenv(ENV, "auto")
    assert calibration_store.folder() == tmp_path / "root" / "calibration"
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    assert calibration_store.folder() == tmp_path / "mine"
    monkeypatch.setenv(ENV, "off")
    assert calibration_store.folder() is None
    monkeypatch.setattr(calibration, "_CACHE", {})
    plan = Plan("laplace", 30, 1.0, 1e-5)
    calibration.calibrate(plan, "pld")
    monkeypatch.setattr(calibration, "_CACHE", {})
    assert not calibration.cached(plan, "pld")
    assert not any(tmp_path.rglob("*.json"))
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(ENV, str(blocker / "calibration"))
    monkeypatch.setattr(calibration, "_CACHE", {})
    assert calibration.calibrate(plan, "pld").noise_multiplier > 0
    monkeypatch.setattr(calibration, "_CACHE", {})
    assert not calibration.cached(plan, "pld")


# -- mpi-dp run: what it imports before the first iteration, and the same bits cold or warm -----

#: `mpi-dp run` that writes, at its first configuration, the heavy modules it has imported and
#: the accountant evaluations of its calibration (JSON to $PROBE_OUT)
PROBE = """import json, os, sys
from mpi_dp import runner
from mpi_dp.privacy import calibration
HEAVY = ("pandas", "pyarrow", "matplotlib", "dp_accounting", "mpi_dp.data.prepare_cli",
         "mpi_dp.data.fetch", "mpi_dp.analysis.forecast_cli")
real = runner._run_one
seen = {}
def first(*a, **k):
    if not seen:
        seen.update(modules=[m for m in HEAVY if m in sys.modules],
                    evaluations=calibration.evaluations())
    return real(*a, **k)
runner._run_one = first
from mpi_dp.cli import main
code = main(sys.argv[1:])
seen["at_exit"] = [m for m in HEAVY if m in sys.modules]
with open(os.environ["PROBE_OUT"], "w") as f:
    json.dump(seen, f)
sys.exit(code)
"""


def _run(tmp_path: Path, job: Path, out: Path, cache: str) -> tuple[dict, str]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    probe = out.with_suffix(".probe.json")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PROBE_OUT=str(probe),
               **{ENV: cache})
    cp = subprocess.run([sys.executable, str(script), "run", str(job), "--out", str(out)],
                        cwd=tmp_path, env=env, capture_output=True, text=True,
                        timeout=HANG_GUARD_S)
    assert cp.returncode == 0, cp.stderr
    assert "Traceback" not in cp.stderr, cp.stderr
    return json.loads(probe.read_text()), cp.stderr


def _contents(path: Path) -> dict:
    """Every dataset (bytes) and every configuration's attributes but its wall time."""
    out: dict = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                a = obj[()]
                out[name] = (a.dtype.str, a.shape, np.asarray(a).tobytes())
        f.visititems(visit)
        for name, g in f["configs"].items():
            for k, v in g.attrs.items():
                if "seconds" not in k:
                    out[f"configs/{name}@{k}"] = np.asarray(v).tobytes()
    return out


def test_a_second_run_reads_its_calibration_and_imports_no_accountant(tmp_path, small_shards):
    job = write_job(tmp_path / "j.toml", small_shards, T=40, runs=2, record_every=10,
                    sweep={"eps": [0.5, 2.0]})
    cache = str(tmp_path / "cal")
    cold, err_cold = _run(tmp_path, job, tmp_path / "cold.h5", cache)
    warm, err_warm = _run(tmp_path, job, tmp_path / "warm.h5", cache)
    fresh, _ = _run(tmp_path, job, tmp_path / "fresh.h5", "off")
    assert cold["evaluations"] > 0 and fresh["evaluations"] > 0
    assert "noise calibration about" in err_cold, err_cold
    assert warm == {"modules": [], "evaluations": 0, "at_exit": []}, (warm, err_warm)
    # the ledgers' PLD and RDP totals at the end come from the disk too (accountants._totals)
    assert "dp_accounting" in cold["at_exit"] and "dp_accounting" in fresh["at_exit"], cold
    assert "noise calibration about" not in err_warm, err_warm  # the estimate knows it is cached
    assert "noise calibrated (pld) for 2 distinct release plan(s)" in err_warm, err_warm
    a, b, c = (_contents(tmp_path / f"{n}.h5") for n in ("cold", "warm", "fresh"))
    assert a.keys() == b.keys() == c.keys() and any("ledger" in k for k in a)
    for k in a:
        assert a[k] == b[k] == c[k], k


def test_a_run_without_noise_imports_no_accountant_before_its_first_iteration(tmp_path,
                                                                               small_shards):
    job = write_job(tmp_path / "j.toml", small_shards, T=20, runs=2, eps=float("inf"))
    got, err = _run(tmp_path, job, tmp_path / "r.h5", "off")
    assert got == {"modules": [], "evaluations": 0, "at_exit": []}, (got, err)


def test_the_cli_imports_a_commands_modules_only_for_it():
    """`mpi-dp run` (the parser and the job's loading) imports none of the data commands'
    modules, pandas or matplotlib; `mpi-dp data synth` and `forecast` still parse."""
    code = """import sys
from mpi_dp import cli
assert cli.main(["run", "no_such_job.toml"]) == 2
print(sorted(m for m in ("pandas", "pyarrow", "matplotlib", "dp_accounting",
                         "mpi_dp.data.prepare_cli", "mpi_dp.data.fetch",
                         "mpi_dp.data.upgrade_cli", "mpi_dp.analysis.forecast_cli")
             if m in sys.modules))
"""
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=HANG_GUARD_S, cwd=ROOT)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "[]", cp.stdout
    assert "no_such_job.toml" in cp.stderr and "Traceback" not in cp.stderr, cp.stderr
    from mpi_dp.cli import build_parser

    ns = build_parser(["data", "synth"]).parse_args(["data", "synth", "--out", "x.h5"])
    assert ns.out is not None
    for words in (["forecast", "--help"], ["data", "prepare", "--help"]):
        with pytest.raises(SystemExit) as e:
            build_parser(words).parse_args(words)
        assert e.value.code == 0
