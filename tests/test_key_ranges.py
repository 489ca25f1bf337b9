"""Every number of a job is checked where it is typed: each numeric key declares its Range, and a
value outside it (NaN, an inf where inf means nothing, a negative count ...) is refused when the
job loads, naming the file, the key, the value and the range, before anything runs; the labels of a
binary shard are checked when its records are first read, before anything runs."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import write_job

from mpi_dp.data.shard_reader import ShardFile
from mpi_dp.data.shard_writer import write_shards
from mpi_dp.errors import JobError, ShardError
from mpi_dp.job import describe_keys, load_job
from mpi_dp.jobspec import GENERIC, SHARED_SECTIONS, method_keys, sweep_key
from mpi_dp.methods import REGISTRY


def _numbers(v):
    """The numbers of a value (a scalar, a per-owner list, a sweep axis of lists)."""
    if isinstance(v, list):
        for x in v:
            yield from _numbers(x)
    elif isinstance(v, int | float) and not isinstance(v, bool):
        yield v


@pytest.mark.parametrize("name", REGISTRY.names())
def test_every_numeric_key_of_every_method_declares_its_range(name):
    """A key that takes numbers without a Range fails here (a new key must say what it accepts);
    a sweep axis checks its values against its key's range; every default lies in its range."""
    m = REGISTRY.get(name)
    keys = method_keys(m)  # (the tests of declared ranges read the jobspec's new names)
    numeric = [k for k, spec in keys.items() if spec.numeric]
    assert "T" in numeric and "eps" in numeric
    missing = [k for k in numeric if keys[k].within is None]
    assert not missing, f"{name}: numeric keys without a declared Range: {missing}"
    for k in m.sweeps:
        if keys[k].numeric:
            assert keys[sweep_key(k)].within == keys[k].within, k
    for k, spec in keys.items():
        if spec.within is not None:
            bad = [x for x in _numbers(spec.default) if not spec.within.admits(x)]
            assert not bad, f"{name}: the default of {k} ({spec.default!r}) is outside {spec.within}"


def test_the_generic_sweep_axes_check_what_their_keys_check():
    from mpi_dp.jobspec import COUNT, POSITIVE_OR_INF, SweepKeys

    sweep = SweepKeys.keys()
    assert sweep["eps"].within == GENERIC["eps"].within == POSITIVE_OR_INF
    assert sweep["n"].within == GENERIC["n"].within == COUNT
    assert SHARED_SECTIONS["sweep"]["owners"].within == COUNT


def test_run_help_shows_each_numeric_key_s_range():
    text = describe_keys()
    assert "[finite and >= 0; default: 1e-05]" in text  # lam
    for m in REGISTRY.specs().values():
        for sec, table in m.sections.items():
            for short, spec in table.items():
                if spec.numeric:
                    lines = [ln for ln in text.splitlines() if ln.strip().startswith(short + " ")]
                    assert any(f"[{spec.within}" in ln for ln in lines), f"{sec}.{short}"


@pytest.mark.parametrize("r, text, inside, outside", [
    ("FINITE", "finite", [0, -1e300, 2.5], [math.nan, math.inf, -math.inf]),
    ("NONNEG", "finite and >= 0", [0, 1e300], [-1e-300, math.inf, math.nan]),
    ("POSITIVE_OR_INF", "> 0 or inf", [1e-300, 1e300, math.inf], [0, -1, math.nan, -math.inf]),
    ("COUNT", "an integer >= 1", [1, 10**12], [0, -3, 2.5, 2.0, math.inf]),
    ("OPEN_UNIT", "in (0, 1)", [0.5, 1e-300], [0, 1, math.nan]),
])
def test_a_range_admits_what_it_says(r, text, inside, outside):
    from mpi_dp import jobspec

    r = getattr(jobspec, r)
    assert str(r) == text
    assert str(jobspec.between(0, 1, lo_open=True)) == "in (0, 1]"
    assert all(r.admits(x) for x in inside) and not any(r.admits(x) for x in outside)


#: (method, keys of the job, the key named, its value as shown, the range): none of these was
#: refused when the job loaded before the ranges (a run failed, or ran on a meaningless value)
BAD = [
    ("sync_star", dict(lam=math.inf), "lam", "inf", "finite and >= 0"),
    ("sync_star", dict(theta0=math.nan), "theta0", "nan", "finite"),
    ("sync_star", dict(average={"eta": math.nan}), "average.eta", "nan", "finite and >= 0"),
    ("sync_star", dict(theta_max=math.nan), "theta_max", "nan", "> 0 or inf"),
    ("sync_star", dict(xi=math.inf), "xi", "inf", "finite and > 0"),
    ("sync_star", dict(xi_quantile=math.nan), "xi_quantile", "nan", "in (0, 1]"),
    ("sync_star", dict(step={"alpha": math.inf}), "step.alpha", "inf", "finite and > 0"),
    ("sync_star", dict(step={"L": math.inf}), "step.L", "inf", "finite and > 0"),
    ("sync_star", dict(step={"rho": math.inf}), "step.rho", "inf", "finite and > 0"),
    ("async_star", dict(variant="proof", lam=-math.inf), "lam", "-inf", "finite and >= 0"),
    ("admm", dict(admm={"prox_scale": math.inf}), "admm.prox_scale", "inf", "finite and > 0"),
    ("dola", dict(dola={"rho": math.nan}), "dola.rho", "nan", "finite and >= 0"),
    ("dola", dict(dola={"ref_agent": -1}), "dola.ref_agent", "-1", "an integer >= 0"),
    ("dola", dict(dola={"graph_degree": math.inf}), "dola.graph_degree", "inf",
     "finite and > 0"),
    ("dola", dict(sweep={"rho": [0.1, math.nan]}), "sweep.rho[1]", "nan", "finite and >= 0"),
    ("p2p", dict(p2p={"mu": math.inf}), "p2p.mu", "inf", "finite and > 0"),
    ("p2p", dict(p2p={"lam": math.inf}), "p2p.lam", "inf", "finite and >= 0"),
    ("p2p", dict(p2p={"tau": math.nan}), "p2p.tau", "nan", "finite and >= 0"),
    ("p2p", dict(p2p={"admm_inner": 0}), "p2p.admm_inner", "0", "an integer >= 1"),
    ("p2p", dict(p2p={"conf_floor": -1.0}), "p2p.conf_floor", "-1.0", "in (0, 1]"),
    ("p2p", dict(p2p={"local_dp_bound": math.inf}), "p2p.local_dp_bound", "inf",
     "finite and > 0"),
    ("p2p", dict(sweep={"mu": [1.0, math.inf]}), "sweep.mu[1]", "inf", "finite and > 0"),
]


def _job(tmp_path: Path, method: str, keys: dict) -> Path:
    """A job of `method` (non-finite numbers written as TOML's inf, -inf and nan)."""
    return write_job(tmp_path / "bad.toml", tmp_path / "data.h5", algorithm=method, **keys)


@pytest.mark.parametrize("method, keys, name, shown, within", BAD,
                         ids=[f"{b[0]}-{b[2]}={b[3]}" for b in BAD])
def test_a_number_outside_its_range_is_refused_when_the_job_loads(tmp_path, method, keys, name,
                                                                   shown, within):
    p = _job(tmp_path, method, keys)
    with pytest.raises(JobError) as e:
        load_job(p)
    assert str(e.value) == f"job file {p}: key '{name}' = {shown}: must be {within}"


@pytest.mark.parametrize("override, fragment", [
    ("T=-3", "key 'T': must be at least 1, got -3"),
    ("T=2.5", "key 'T': expected integer, got float 2.5"),
    ("dola.window=2.5", "key 'dola.window': expected integer, got float 2.5"),
    ("dola.passes=0", "key 'dola.passes'"),
])
def test_a_negative_or_fractional_count_is_refused_naming_the_key(tmp_path, override, fragment):
    p = write_job(tmp_path / "j.toml", tmp_path / "data.h5", algorithm="dola")
    with pytest.raises(JobError) as e:
        load_job(p, [override])
    assert fragment in str(e.value) and str(p) in str(e.value)


def test_huge_finite_numbers_still_load(tmp_path):
    """eps = 1e300 and T = 10^12 are in range (the run's estimate refuses the T later)."""
    p = write_job(tmp_path / "j.toml", tmp_path / "data.h5", T=10**12, eps=1e300,
                  sweep={"eps": [1e300, [1.0, math.inf, 1e300]]})
    job = load_job(p)
    assert job["T"] == 10**12 and job["eps"] == 1e300


def test_lists_and_sweep_axes_are_checked_entry_by_entry(tmp_path):
    from mpi_dp.jobspec import COUNT, POSITIVE_OR_INF, Key, check_ranges

    keys = {"eps": Key((int, float, list), 1.0, "", within=POSITIVE_OR_INF),
            "sweep.eps": Key((list,), None, "", within=POSITIVE_OR_INF),
            "n": Key((int, str, list), "all", "", within=COUNT)}
    check_ranges("j.toml", {"eps": [1.0, math.inf], "sweep.eps": [[1.0, 2.0], 3.0],
                            "n": "all"}, keys)
    with pytest.raises(JobError, match=r"key 'sweep\.eps\[0\]\[1\]' = -2\.0: must be > 0 or "
                                       r"inf$"):
        check_ranges("j.toml", {"eps": 1.0, "sweep.eps": [[1.0, -2.0]], "n": "all"}, keys)
    with pytest.raises(JobError, match=r"key 'n\[2\]' = 2\.5: must be an integer >= 1$"):
        check_ranges("j.toml", {"eps": 1.0, "sweep.eps": None, "n": [3, 4, 2.5]}, keys)


# -- binary labels -----------------------------------------------------------------------------

def _binary_agents(rng: np.random.Generator, labels=(-1.0, 1.0)) -> list:
    out = []
    for n in (60, 50, 70):
        X = rng.normal(size=(n, 3))
        out.append((X, np.where(X[:, 0] > 0, labels[1], labels[0])))
    return out


def _set_label(path: Path, owner: int, record: int, value: float) -> None:
    """Change one stored label (a file written elsewhere, or by an older tool)."""
    with h5py.File(path, "r+") as f:
        if "offsets" in f["agents"]:
            f["agents/y"][int(f["agents/offsets"][owner]) + record] = value
        else:
            f[f"agents/{owner}/y"][record] = value


@pytest.mark.parametrize("layout", ["blocks", "groups"])
@pytest.mark.parametrize("value", [0.5, 0.0])
def test_a_binary_shard_with_a_label_not_plus_or_minus_one_is_refused(tmp_path, layout, value):
    path = write_shards(tmp_path / "bin.h5", _binary_agents(np.random.default_rng(1)),
                        task="binary", layout=layout)
    ShardFile(path).check_finite()  # the writer's file is fine
    _set_label(path, 1, 7, value)
    with pytest.raises(ShardError) as e:
        ShardFile(path).check_finite()
    assert str(e.value).startswith(f"shard file '{path}': owner 1: record 7 has the label "
                                   f"{value:g}: a binary shard's labels must be -1 or +1")
    ShardFile(path).check_finite([0, 2])  # the other owners' records are fine


def test_a_binary_shard_s_public_labels_are_checked(tmp_path):
    rng = np.random.default_rng(2)
    Xp = rng.normal(size=(40, 3))
    path = write_shards(tmp_path / "pub.h5", _binary_agents(rng), task="binary",
                        public=(Xp, np.where(Xp[:, 0] > 0, 1.0, -1.0)))
    with h5py.File(path, "r+") as f:
        f["public/y"][3] = 2.0
    with pytest.raises(ShardError, match=r"public records \(/public\): record 3 has the label 2: "
                                         "a binary shard's labels must be -1 or"):
        ShardFile(path).read_public()


def test_sync_star_logistic_on_a_label_of_one_half_stops_before_anything_runs(tmp_path):
    """One clear error line naming the file, the owner and the value; no result, no partial."""
    path = write_shards(tmp_path / "bin.h5", _binary_agents(np.random.default_rng(3)),
                        task="binary")
    _set_label(path, 2, 11, 0.5)
    job = write_job(tmp_path / "logit.toml", path, loss="logistic", xi=1.0, step={"L": 1.0},
                    T=10, runs=1)
    out = tmp_path / "logit.h5"
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "run", str(job), "--out", str(out)],
                        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = [ln for ln in cp.stderr.splitlines() if ln.startswith("mpi-dp: error")]
    assert cp.returncode == 2 and len(errors) == 1, cp.stderr
    assert errors[0] == (f"mpi-dp: error: shard file '{path}': owner 2: record 11 has the label "
                         "0.5: a binary shard's labels must be -1 or +1 (0/1 labels: write the "
                         "file with mpi-dp data prepare --task binary, which maps them)")
    assert "Traceback" not in cp.stderr
    assert not out.exists() and not Path(f"{out}.partial").exists()


@pytest.mark.parametrize("fault", ["label", "nan"])
def test_a_swept_p2p_shard_is_checked_like_the_job_s(tmp_path, fault):
    """p2p.shard sweeps over shard files besides the job's data: each is checked when opened,
    as the job's data is: a label 0.5 or a NaN feature in the second stops the job before
    anything runs, with the shard checks' own line."""
    from mpi_dp.data.synth import write_synth

    good = write_synth(tmp_path / "a.h5", "p2p", 16, 0, 4, 0.05, 3)
    bad = write_synth(tmp_path / "b.h5", "p2p", 16, 0, 4, 0.05, 4)
    if fault == "label":
        _set_label(bad, 5, 2, 0.5)
        said = "record 2 has the label 0.5: a binary shard's labels must be -1 or +1"
    else:
        with h5py.File(bad, "r+") as f:
            f["agents/X"][int(f["agents/offsets"][5]) + 2, 1] = np.nan
        said = "record 2, feature 1 is nan: the data must be finite"
    job = write_job(tmp_path / "p.toml", good, algorithm="p2p", T=16 * 8, runs=1,
                    record_every=64, sweep={"shard": [str(good), str(bad)]})
    out = tmp_path / "p.h5"
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "run", str(job), "--out", str(out)],
                        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = [ln for ln in cp.stderr.splitlines() if ln.startswith("mpi-dp: error")]
    assert cp.returncode == 2 and len(errors) == 1, cp.stderr
    assert f"shard file '{bad}': owner 5: " in errors[0] and said in errors[0], errors
    assert "Traceback" not in cp.stderr
    assert not out.exists() and not Path(f"{out}.partial").exists()
