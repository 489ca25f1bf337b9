"""Adding a method takes one module and one registry line: a toy method defined here, registered
with REGISTRY.add, run under `mpiexec -n 2` through the CLI, analysed and plotted.

The toy: every owner releases, T times, the mean of its labels clipped to [-bound, bound] plus
Laplace noise of scale 2 bound T / (n_i eps_i) (so its T releases are eps_i-DP); the learner on
rank 0 averages the releases over owners (weights n_i / n) and over iterations. Its metric is the
distance of that estimate to the un-noised clipped mean (evaluation-only).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import HANG_GUARD_S, MPIEXEC

from mpi_dp.jobspec import Key
from mpi_dp.methods import Method, Outcome
from mpi_dp.privacy import Ledger, laplace_mechanism
from mpi_dp.rng import run_streams


class ToyMean(Method):
    name = "toy_mean"
    summary = "toy: the DP mean of the owners' clipped labels"
    variants = ("plain",)
    variant_help = "plain (the only one)"
    sections = {"toy": {"bound": Key((int, float), 1.0, "clip labels to [-bound, bound]")}}
    default_metric = "error"

    def settings(self, ctx, prepared, rc):
        return {"T": ctx.job["T"], "record_every": ctx.job["record_every"], "eps": rc.eps,
                "n": rc.n, "bound": float(ctx.job["toy.bound"])}

    def record_attrs(self, ctx, prepared, rc, s):
        return {"T": s["T"], "bound": s["bound"]}

    def run_config(self, ctx, prepared, rc, s, recorder, label):
        star, R, B, T = ctx.star, ctx.runs, s["bound"], s["T"]
        owners = []
        for i in star.local_agents:
            _, y = ctx.shard.read_agent(i, s["n"][i])
            mean = float(np.clip(y, -B, B).mean())
            owners.append((i, mean, Ledger(i, s["eps"][i], runs=R),
                           run_streams(ctx.job["seed"], "noise", i, ctx.run_ids)))
        w = np.array(s["n"], dtype=float) / sum(s["n"])
        clean = star.gather_agents(np.array([[m] for _, m, _, _ in owners]).reshape(-1, 1), (1,))
        total = np.zeros(R)
        for k in range(1, T + 1):
            local = np.empty((len(owners), R))
            for j, (i, mean, ledger, gens) in enumerate(owners):
                sens, scale = 2 * B / s["n"][i], 2 * B * T / (s["n"][i] * s["eps"][i])
                out, _ = laplace_mechanism(np.full((R, 1), mean), gens, scale, sens, ledger)
                local[j] = out[:, 0]
            got = star.gather_agents(local, (R,))
            if star.is_learner:
                total += sum(w[i] * got[i] for i in range(len(w)))
                if recorder is not None and (k % s["record_every"] == 0 or k == T):
                    est = total / k
                    recorder.append(k, {"error": np.abs(est - float(w @ clean[:, 0]))})
        ledgers = star.gather_objects([led for _, _, led, _ in owners])
        if not star.is_learner:
            return None
        return Outcome(sorted((x for part in ledgers for x in part), key=lambda x: x.agent),
                       guarantee="each owner's T releases are eps_i-DP together")


LAUNCHER = """\
import sys
sys.path.insert(0, {tests!r})
from mpi_dp.methods import REGISTRY
from test_toy_method import ToyMean
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


def _job(tmp_path, data, extra="") -> Path:
    job = tmp_path / "toy.toml"
    job.write_text(f'algorithm = "toy_mean"\ndata = "{data}"\noutput = "{tmp_path / "toy.h5"}"\n'
                   f'seed = 3\nruns = 4\nT = 50\nrecord_every = 10\n{extra}\n'
                   '[toy]\nbound = 2.0\n[sweep]\neps = [0.5, 5.0, inf]\n')
    return job


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
        np.testing.assert_allclose(led["eps_basic"], 0.5, rtol=1e-12)
        assert np.all(led["eps_pld"] < led["eps_basic"]) and np.all(led["eps_pld"] >= 0.5 / 50)
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
