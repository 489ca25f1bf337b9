"""A new method in three files that never mention a calibration rule: tests/toy_method.py (its
entry), tests/toy_algorithm.py (its algorithm) and one registry line (REGISTRY.add); run under
`mpiexec -n 2` through the CLI, analysed and plotted, its noise set by the job's contract.

The toy: every owner releases, T times, the mean of its labels clipped to [-bound, bound]; the
learner on rank 0 averages the releases over owners (weights n_i / n) and over iterations. Its
metric is the distance of that estimate to the un-noised clipped mean (evaluation-only). The
method declares each owner's plan (T Laplace releases) and asks its release path for them: the
contract calibrates the noise (pld, basic) and refuses what the plan does not cover.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import HANG_GUARD_S, MPIEXEC

TESTS = Path(__file__).parent
#: the toy's own files (the third is the registry line in LAUNCHER)
TOY_FILES = (TESTS / "toy_method.py", TESTS / "toy_algorithm.py")

LAUNCHER = """\
import sys
sys.path.insert(0, {tests!r})
from mpi_dp.methods import REGISTRY
from toy_method import ToyMean
REGISTRY.add(ToyMean())  # the one registry line a new method needs
from mpi_dp.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _cli(launcher: Path, args: list[str], n: int | None = None) -> subprocess.CompletedProcess:
    cmd = ([MPIEXEC, "-n", str(n)] if n else []) + [sys.executable, str(launcher), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S,
                          env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))


@pytest.fixture
def launcher(tmp_path) -> Path:
    p = tmp_path / "toy_cli.py"
    p.write_text(LAUNCHER.format(tests=str(Path(__file__).parent)))
    return p


def _job(tmp_path, data, extra="", eps="[0.5, 5.0, inf]", toy="") -> Path:
    job = tmp_path / "toy.toml"
    job.write_text(f'algorithm = "toy_mean"\ndata = "{data}"\noutput = "{tmp_path / "toy.h5"}"\n'
                   f'seed = 3\nruns = 4\nT = 50\nrecord_every = 10\n{extra}\n'
                   f'[toy]\nbound = 2.0\n{toy}\n[sweep]\neps = {eps}\n')
    return job


def test_the_toy_is_three_files_that_never_mention_a_calibration_rule():
    words = re.compile(r"\b(pld|basic|paper|calibrat\w*|rules?|noise_multiplier)\b", re.I)
    for f in TOY_FILES:
        assert not words.findall(f.read_text()), (f, words.findall(f.read_text()))
    assert LAUNCHER.count("REGISTRY.add(") == 1  # the third: one line in the registry


def test_a_toy_method_registered_in_one_line_runs_analyses_and_plots(tmp_path, small_shards,
                                                                     launcher):
    job = _job(tmp_path, small_shards)
    cp = _cli(launcher, ["run", str(job), "--quiet"], n=2)
    assert cp.returncode == 0, cp.stderr
    with h5py.File(tmp_path / "toy.h5", "r") as f:
        assert f.attrs["algorithm"] == "toy_mean" and f.attrs["status"] == "complete"
        err = [f[f"configs/{c:03d}/metrics/error"][()] for c in range(3)]
        assert err[0].shape == (5, 4) and f["configs/000/metrics/iteration"][-1] == 50
        assert np.all(err[2] < 1e-12)  # eps = inf: no noise, the exact clipped mean
        assert err[0][-1].mean() > 3 * err[1][-1].mean() > 0  # 10x the budget: less error
        led = f["configs/000/privacy/ledger"][()]
        assert led["agent"].tolist() == [0, 1, 2] and np.all(led["releases"] == 50)
        # the contract calibrated it (pld, the default): each owner's tight total is its eps
        assert np.all(led["eps_pld"] <= 0.5 * (1 + 1e-9)) and np.all(led["eps_pld"] >= 0.499)
        assert set(led["calibration"].tolist()) == {b"pld"}
        assert f["configs/000"].attrs["calibration"] == "pld"
        inf = f["configs/002/privacy/ledger"][()]  # eps = inf: no noise reads eps = inf
        assert np.all(np.isinf(inf["eps_pld"])) and np.all(inf["releases"] == 50)
        assert f["configs/000/privacy/ledger"].attrs["guarantee"].startswith("each owner's T")
    cp = _cli(launcher, ["analyze", str(tmp_path / "toy.h5")])
    assert cp.returncode == 0, cp.stderr
    assert "metric error at the last recorded iteration" in cp.stdout
    assert "privacy ledger" in cp.stdout and "owners 0-2" in cp.stdout
    cp = _cli(launcher, ["plot", str(tmp_path / "toy.h5"), "--out", str(tmp_path / "fig")])
    assert cp.returncode == 0, cp.stderr
    pngs = cp.stdout.split()
    assert str(tmp_path / "fig_bands.png") in pngs and all(Path(p).stat().st_size > 0
                                                            for p in pngs)
    cp = _cli(launcher, ["run", "--help"])
    assert 'algorithm = "toy_mean"' in cp.stdout and "clip labels to [-bound, bound]" in cp.stdout


def test_the_toy_under_the_even_split_and_without_a_paper_rule(tmp_path, small_shards, launcher):
    """privacy.calibration = 'basic' gives each release eps / T (the basic total is eps); the toy
    states no paper rule, so 'paper' is refused before any output, naming the key."""
    job = _job(tmp_path, small_shards, extra='[privacy]\ncalibration = "basic"', eps="[0.5]")
    cp = _cli(launcher, ["run", str(job), "--quiet"], n=2)
    assert cp.returncode == 0, cp.stderr
    with h5py.File(tmp_path / "toy.h5", "r") as f:
        led = f["configs/000/privacy/ledger"][()]
        np.testing.assert_allclose(led["eps_basic"], 0.5, rtol=1e-9)
        np.testing.assert_allclose(led["eps_per_release"], 0.5 / 50, rtol=1e-9)
        assert math.isclose(float(led["noise_multiplier"][0]), 50 / 0.5, rel_tol=1e-12)
    (tmp_path / "toy.h5").unlink()
    job = _job(tmp_path, small_shards, extra='[privacy]\ncalibration = "paper"', eps="[0.5]")
    cp = _cli(launcher, ["run", str(job)], n=2)
    assert cp.returncode == 2 and "key 'privacy.calibration'" in cp.stderr, cp.stderr
    assert "no paper rule" in cp.stderr and not (tmp_path / "toy.h5").exists()


def test_a_release_the_plan_does_not_cover_is_refused(tmp_path, small_shards, launcher):
    """The toy's plan is T releases per owner; one more is refused by the owner's ledger before
    its noise is drawn, and the run stops with the owner named."""
    job = _job(tmp_path, small_shards, eps="[0.5]", toy="extra = 1")
    cp = _cli(launcher, ["run", str(job), "--quiet"], n=2)
    assert cp.returncode != 0
    assert "refuses release 51" in cp.stderr, cp.stderr


@pytest.mark.parametrize("extra, message", [
    ("xi = 1.0", "key 'xi': is not read by algorithm 'toy_mean' (only sync_star, async_star "
     "read it)"),
    ("[admm]\ngamma = 0.1", "key 'admm': the [admm] section belongs to algorithm 'admm', not "
     "'toy_mean'"),
])
def test_a_key_of_another_method_is_an_error_naming_it(tmp_path, small_shards, launcher, extra,
                                                       message):
    job = _job(tmp_path, small_shards, extra)
    cp = _cli(launcher, ["run", str(job)], n=2)
    assert cp.returncode == 2 and cp.stderr.count(message) == 1, cp.stderr
    assert not (tmp_path / "toy.h5").exists()


def test_the_toy_is_not_registered_unless_added(tmp_path, small_shards):
    """Without the registry line the job names an unknown algorithm (the toy left no trace)."""
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "run", str(_job(tmp_path, small_shards))],
                        capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert cp.returncode == 2 and "'toy_mean' is not one of 'sync_star'" in cp.stderr
