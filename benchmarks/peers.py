"""mpi_dp beside its peers (issue 44): the same DP logistic-regression task run by mpi_dp
(`sync_star` under `mpiexec -n 2`), Apple's pfl-research (pfl 0.6, a NumPy model in its
simulator, `CentrallyAppliedPrivacyMechanism(GaussianMechanism)`) and Flower (1.42, its
simulation engine on 2 CPUs, `DifferentialPrivacyServerSideFixedClipping` around FedAvg).

The task: N owners x 500 records of `mpi-dp data synth --task binary --dim 10` (11 features with
the bias column), full-batch clipped gradients of the logistic loss, noise every round, T rounds;
the shard's public records are the global test set. Every system gets the same records (pfl and
Flower read them from an .npz written from the shard, owner by owner), the same T and the same
(eps, delta); the parent evaluates every final model on the same test set and says whether the
test accuracies agree within --tolerance (equal work) or where they differ.

Where the work differs (printed): mpi_dp's sync_star is record-level DP with local noise (each
owner clips every record's gradient to L1 norm xi and adds Laplace noise to its gradient mean,
calibrated by PLD to (eps, delta) over its T answers), decreasing steps (1/L)/sqrt(k) and
averaging; pfl and Flower are client-level central DP (the server clips every client's update to
L2 norm lr*C and adds Gaussian noise to their sum; FedSGD, one full-batch step of constant lr =
1/L per client and round). The clipping norms cannot be one number (record-level L1 vs
client-level L2): both come from the public records at theta = 0 (xi: the 99th percentile of
the per-record gradients' L1 norms; C: the norm of the mean gradient). The Gaussian noise
multiplier of the peers meets (eps, delta) for T full-participation rounds exactly (T Gaussian
releases = one at sigma/sqrt(T), the analytic Gaussian mechanism); Flower gets it from this
script, pfl computes its own with its `PLDPrivacyAccountant` (printed beside: PLD rounds up).

How it is timed (every system launched as a subprocess, wall time from launch to exit = total):
- mpi_dp: the job at T (total, final model) and at T + --extra-rounds; per round =
  difference of the two files' `provenance.wall_seconds` (the run after the noise calibration:
  reference, configuration, loop) / extra rounds, so the set-up cancels;
- pfl, Flower: a driver script (written into a temporary folder, run by the peer's own venv's
  python) stamps the end of every round; per round = (end of round T - end of round 1) / (T - 1)
  (the first round's warm-up, e.g. Flower starting its actors, counts as start-up);
- start-up = total - T x per round. Blocks interleave the systems at every N; medians and
  [min, max] over the blocks; ratios peer / mpi_dp per block, then their median.

Peers live in their own virtual environments (default ~/.cache/mpi_dp/peers/<name>):
`--install` creates them (`python -m venv`, `pip install pfl`, `pip install "flwr[simulation]"`);
without it a peer whose venv is missing is skipped with the reason.

    python benchmarks/peers.py --install                  # N = 10, 100, 1000, T = 20, 3 blocks
    python benchmarks/peers.py --N 10000 --peers pfl --blocks 1
    python benchmarks/peers.py --quick                    # smoke test: N = 10, T = 5 (seconds)

How long (shared 2-core VM): mpi_dp 5-20 s per run (two runs per block); pfl ~10 s + ~0.4 ms
per owner-round; Flower 20-40 s of start-up + ~15-20 ms per owner-round: at N = 1,000 it did not
finish within --timeout 600 s here, so the default run takes ~25 min (--install: a few minutes
once, Flower pulls Ray). A peer that times out at N is not run at N or beyond again.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import h5py
import numpy as np
from scipy.stats import norm

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: --quick: the smallest meaningful case (options given explicitly win)
QUICK = {"N": "10", "T": 5, "blocks": 1, "extra_rounds": 20, "timeout": 150.0}


@dataclass(frozen=True)
class Peer:
    """A peer system: its pip requirement, the module that says its version, its driver."""

    name: str
    pip: tuple[str, ...]
    module: str
    driver: str


PFL_DRIVER = r'''"""pfl driver (benchmarks/peers.py): FedSGD on full-batch logistic gradients in pfl's
simulator, central DP by CentrallyAppliedPrivacyMechanism(GaussianMechanism)."""
import json, sys, time
T0 = time.perf_counter()
import numpy as np
import pfl
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByUser
from pfl.algorithm.base import FederatedAlgorithm
from pfl.callback.base import TrainingProcessCallback
from pfl.common_types import Population
from pfl.context import CentralContext
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam.base import AlgorithmHyperParams, ModelHyperParams
from pfl.metrics import Metrics
from pfl.model.base import Model
from pfl.privacy import CentrallyAppliedPrivacyMechanism, GaussianMechanism, PLDPrivacyAccountant
from pfl.stats import MappedVectorStatistics

P = json.load(open(sys.argv[1]))
D = np.load(P["data"])
X, y, off = D["X"], D["y"], D["offsets"]
N, T, LR = len(off) - 1, P["T"], P["lr"]
USERS = {i: [X[off[i]:off[i + 1]], y[off[i]:off[i + 1]]] for i in range(N)}


class LogReg(Model):
    """NumPy logistic regression: theta moves by the averaged (noisy) client update."""
    def __init__(self, dim):
        self.theta = np.zeros(dim)

    def apply_model_update(self, statistics):
        statistics.average()
        self.theta += statistics["theta"]
        return self, Metrics()


class FedSGD(FederatedAlgorithm):
    """Every round the whole population, one full-batch gradient step per client."""
    def get_next_central_contexts(self, model, iteration, algorithm_params, model_train_params,
                                  model_eval_params=None):
        if iteration == T:
            return None, model, Metrics()
        ctx = CentralContext(current_central_iteration=iteration, do_evaluation=False,
                             cohort_size=N, population=Population.TRAIN,
                             model_train_params=model_train_params,
                             model_eval_params=model_eval_params,
                             algorithm_params=algorithm_params, seed=self._get_seed())
        return (ctx,), model, Metrics()

    def process_aggregated_statistics(self, central_context, aggregate_metrics, model,
                                      statistics):
        return model.apply_model_update(statistics)

    def simulate_one_user(self, model, user_dataset, central_context):
        Xu, yu = user_dataset.raw_data
        s = 0.5 * (1.0 - np.tanh(0.5 * yu * (Xu @ model.theta)))  # sigmoid(-y x.theta)
        g = -(Xu.T @ (yu * s)) / len(yu)
        return MappedVectorStatistics({"theta": -LR * g}), Metrics()


class Clock(TrainingProcessCallback):
    def __init__(self):
        self.ends = []

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        self.ends.append(time.perf_counter() - T0)
        return False, Metrics()


np.random.seed(P["seed"])
accountant = PLDPrivacyAccountant(num_compositions=T, sampling_probability=1.0,
                                  mechanism="gaussian", epsilon=P["eps"], delta=P["delta"])
mechanism = GaussianMechanism.from_privacy_accountant(accountant=accountant,
                                                      clipping_bound=LR * P["clip"])
data = FederatedDataset.from_slices(USERS, get_user_sampler("minimize_reuse", list(range(N))))
backend = SimulatedBackend(training_data=data, val_data=None,
                           postprocessors=[WeightByUser(),
                                           CentrallyAppliedPrivacyMechanism(mechanism)])
clock, model = Clock(), LogReg(X.shape[1])
FedSGD().run(algorithm_params=AlgorithmHyperParams(), backend=backend, model=model,
             model_train_params=ModelHyperParams(), callbacks=[clock],
             send_metrics_to_platform=False)
print(json.dumps({"version": getattr(pfl, "__version__", "?"),
                  "noise_multiplier": float(accountant.cohort_noise_parameter),
                  "round_ends": clock.ends, "theta": model.theta.tolist()}))
'''

FLOWER_DRIVER = r'''"""Flower driver (benchmarks/peers.py): FedSGD on full-batch logistic gradients in
Flower's simulation engine, central DP by DifferentialPrivacyServerSideFixedClipping (FedAvg)."""
import json, os, sys, time
T0 = time.perf_counter()
import numpy as np
import flwr
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
from flwr.simulation import run_simulation

os.environ["MPI_DP_PEER_PARAMS"] = sys.argv[1]  # the client actors (other processes) read it
P = json.load(open(sys.argv[1]))
_DATA = {}


def shard(i):
    """Client i's records (loaded once per actor process)."""
    if "d" not in _DATA:
        params = json.load(open(os.environ["MPI_DP_PEER_PARAMS"]))
        _DATA["d"] = dict(np.load(params["data"]))
    d = _DATA["d"]
    a, b = d["offsets"][i], d["offsets"][i + 1]
    return d["X"][a:b], d["y"][a:b]


client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    theta = msg.content["arrays"].to_numpy_ndarrays()[0]
    lr = msg.content["config"]["lr"]
    X, y = shard(int(context.node_config["partition-id"]))
    s = 0.5 * (1.0 - np.tanh(0.5 * y * (X @ theta)))  # sigmoid(-y x.theta)
    g = -(X.T @ (y * s)) / len(y)
    content = RecordDict({"arrays": ArrayRecord([theta - lr * g]),
                          "metrics": MetricRecord({"num-examples": len(y)})})
    return Message(content=content, reply_to=msg)


server = ServerApp()
OUT = {"round_ends": []}


@server.main()
def main(grid: Grid, context: Context) -> None:
    N, T = P["N"], P["T"]
    strategy = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=N,
               min_available_nodes=N),
        noise_multiplier=P["noise_multiplier"], clipping_norm=P["lr"] * P["clip"],
        num_sampled_clients=N)

    def clock(server_round, arrays):
        if server_round > 0:
            OUT["round_ends"].append(time.perf_counter() - T0)
        return None

    result = strategy.start(grid=grid, initial_arrays=ArrayRecord([np.zeros(P["dim"])]),
                            num_rounds=T, train_config=ConfigRecord({"lr": P["lr"]}),
                            evaluate_fn=clock)
    OUT["theta"] = result.arrays.to_numpy_ndarrays()[0].tolist()


np.random.seed(P["seed"])
run_simulation(server_app=server, client_app=client, num_supernodes=P["N"],
               backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                               "init_args": {"num_cpus": P["cpus"],
                                             "include_dashboard": False}})
print(json.dumps({"version": flwr.__version__, "noise_multiplier": P["noise_multiplier"],
                  **OUT}))
'''

PEERS = {"pfl": Peer("pfl", ("pfl",), "pfl", PFL_DRIVER),
         "flower": Peer("flower", ("flwr[simulation]",), "flwr", FLOWER_DRIVER)}
DP_LINE = ("DP: mpi_dp sync_star: record-level DP, each owner adds Laplace noise to its clipped "
           "gradient mean (local noise, L1 clip xi per record); pfl/flower: client-level central "
           "DP, the server clips each client's update (L2, lr*C) and adds Gaussian noise to their "
           "sum")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--N", default="10,100,1000", help="numbers of owners, comma-separated")
    ap.add_argument("--T", type=int, default=20, help="rounds")
    ap.add_argument("--blocks", type=int, default=3, help="interleaved blocks")
    ap.add_argument("--records", type=int, default=500, help="records per owner")
    ap.add_argument("--dim", type=int, default=10, help="features (before the bias column)")
    ap.add_argument("--eps", type=float, default=10.0,
                    help="each system's eps (mpi_dp: per record; peers: per client)")
    ap.add_argument("--delta", type=float, default=1e-5, help="each system's delta")
    ap.add_argument("--ranks", type=int, default=2, help="mpi_dp's MPI ranks (mpiexec -n)")
    ap.add_argument("--cpus", type=int, default=2, help="Flower's simulation CPUs (Ray)")
    ap.add_argument("--extra-rounds", dest="extra_rounds", type=int, default=200,
                    help="mpi_dp's second run has T + this many rounds (its per-round time)")
    ap.add_argument("--peers", default="pfl,flower", help="peers to run (pfl, flower; '' none)")
    ap.add_argument("--install", action="store_true",
                    help="create each peer's venv and pip install it (pfl; flwr[simulation])")
    ap.add_argument("--venv-dir", dest="venv_dir",
                    default=str(pathlib.Path.home() / ".cache" / "mpi_dp" / "peers"),
                    help="folder of the peers' virtual environments (one per peer)")
    ap.add_argument("--tolerance", type=float, default=0.03,
                    help="test accuracies agree when within this of each other")
    ap.add_argument("--timeout", type=float, default=900.0,
                    help="seconds before one peer run is given up (its process group killed; "
                    "the peer is not run again at that N or beyond)")
    ap.add_argument("--seed", type=int, default=1, help="data and noise seed")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test (tests/test_benchmarks.py): "
                    + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                    + " (options given explicitly win; peers run only where their venv exists)")
    a = ap.parse_args(argv)
    if a.quick:
        for k, v in QUICK.items():
            if getattr(a, k) == ap.get_default(k):
                setattr(a, k, v)
    a.sizes = [int(n) for n in str(a.N).split(",")]
    a.peer_names = [p.strip() for p in a.peers.split(",") if p.strip()]
    unknown = sorted(set(a.peer_names) - set(PEERS))
    if unknown:
        ap.error(f"--peers: unknown {unknown}; known: {sorted(PEERS)}")
    if a.T < 2:
        ap.error("--T: at least 2 rounds (a peer's per-round time spans rounds 1 to T)")
    return a


# -- peers' virtual environments -------------------------------------------------------------
def _tail(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def prepare_peer(a: argparse.Namespace, peer: Peer) -> tuple[pathlib.Path | None, str]:
    """(the venv's python, its version text), or (None, why the peer is skipped)."""
    venv = pathlib.Path(a.venv_dir).expanduser() / peer.name
    py = venv / "bin" / "python"
    pip_text = " ".join(f'"{r}"' if "[" in r else r for r in peer.pip)
    if a.install:
        try:
            if not py.exists():
                print(f"{peer.name}: creating {venv} (python -m venv)", flush=True)
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                               capture_output=True, text=True)
            print(f"{peer.name}: pip install {pip_text} into {venv}", flush=True)
            subprocess.run([str(py), "-m", "pip", "install", "--quiet", *peer.pip], check=True,
                           capture_output=True, text=True, env=_peer_env())
        except subprocess.CalledProcessError as e:
            return None, (f"cannot install ({' '.join(map(str, e.cmd[:4]))} ...: exit "
                          f"{e.returncode}: {_tail(e.stderr or e.stdout or '')})")
    if not py.exists():
        return None, (f"no virtual environment at {venv} (pass --install to create it: "
                      f"pip install {pip_text})")
    cp = subprocess.run([str(py), "-c", f"import {peer.module} as m; print(m.__version__)"],
                        capture_output=True, text=True, env=_peer_env())
    if cp.returncode != 0:
        return None, (f"{peer.module} does not import in {venv}: {_tail(cp.stderr)} (pass "
                      f"--install)")
    return py, f"{peer.module} {cp.stdout.strip()} in {venv}"


def _peer_env() -> dict[str, str]:
    """The environment of a peer's process: one BLAS thread (as mpi_dp's ranks), no
    PYTHONPATH (the peer's venv imports its own packages only)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return dict(env, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", RAY_DEDUP_LOGS="0")


# -- the task ---------------------------------------------------------------------------------
@dataclass
class Task:
    """One N: the shard, its .npz, the public constants and the noise multiplier."""

    N: int
    folder: pathlib.Path
    shard: pathlib.Path
    npz: pathlib.Path
    X_test: np.ndarray
    y_test: np.ndarray
    xi: float  # mpi_dp: L1 clip of a record's gradient
    C: float  # peers: L2 clip of a client's mean gradient (the update is lr * it)
    L: float  # smoothness of the logistic loss on the public records
    sigma: float  # peers' Gaussian noise multiplier for (eps, delta) over T rounds
    job: pathlib.Path = field(default=pathlib.Path())


def gaussian_delta(mu: float, eps: float) -> float:
    """delta(eps) of the Gaussian mechanism at sensitivity / sigma = mu (Balle & Wang 2018)."""
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


def noise_multiplier(eps: float, delta: float, T: int) -> float:
    """sigma such that T Gaussian releases of sensitivity 1 (full participation, composed
    exactly: one release at sigma / sqrt(T)) are (eps, delta)-DP."""
    lo, hi = 1e-3, 1e4  # mu = sqrt(T) / sigma: delta falls as sigma grows
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if gaussian_delta(math.sqrt(T) / mid, eps) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def make_task(a: argparse.Namespace, N: int, tmp: pathlib.Path) -> Task:
    folder = tmp / f"N{N}"
    folder.mkdir()
    shard = folder / "shard.h5"
    subprocess.run([sys.executable, "-m", "mpi_dp", "data", "synth", "--task", "binary",
                    "--agents", str(N), "--records", str(a.records), "--dim", str(a.dim),
                    "--seed", str(a.seed), "--public", "10000", "--out", str(shard)],
                   check=True, capture_output=True, text=True)
    with h5py.File(shard, "r") as f:
        X, y, off = f["agents/X"][:], f["agents/y"][:], f["agents/offsets"][:]
        X_test, y_test = f["public/X"][:], f["public/y"][:]
    npz = folder / "data.npz"
    np.savez(npz, X=X, y=y, offsets=off)
    xi = float(np.quantile(0.5 * np.abs(X_test).sum(axis=1), 0.99))  # |dloss/dz| <= 1/2 at 0
    C = float(np.linalg.norm((X_test * y_test[:, None]).mean(axis=0)) / 2)
    L = float(np.linalg.eigvalsh(X_test.T @ X_test)[-1] / (4 * len(y_test)))
    task = Task(N, folder, shard, npz, X_test, y_test, xi, C, L,
                noise_multiplier(a.eps, a.delta, a.T))
    task.job = folder / "job.toml"
    task.job.write_text(
        f'name = "peers_N{N}"\nalgorithm = "sync_star"\ndata = "{shard}"\nseed = {a.seed}\n'
        f'runs = 1\nT = {a.T}\nloss = "logistic"\nxi = {xi!r}\neps = {a.eps!r}\n'
        f"record_every = 0\n\n[privacy]\ndelta = {a.delta!r}\n\n[reference]\nisolated = 0\n")
    return task


def accuracy(task: Task, theta: np.ndarray) -> float:
    """Test accuracy of sign(x . theta) (sign(0) = +1, the shard's convention)."""
    pred = np.where(task.X_test @ theta >= 0, 1.0, -1.0)
    return float(np.mean(pred == task.y_test))


# -- one measurement of each system ------------------------------------------------------------
def run_mpi_dp(a: argparse.Namespace, task: Task) -> dict:
    """The job at T (total, model) and at T + extra rounds (per round from wall_seconds)."""
    mpiexec = pathlib.Path(sys.executable).parent / "mpiexec"
    launcher = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(a.ranks)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    out: dict = {}
    for key, T in (("short", a.T), ("long", a.T + a.extra_rounds)):
        res = task.folder / f"mpi_dp_{key}.h5"
        t0 = time.perf_counter()
        cp = subprocess.run([*launcher, sys.executable, "-m", "mpi_dp", "run", str(task.job),
                             "--out", str(res), "--overwrite", "--quiet", "--set", f"T={T}"],
                            cwd=task.folder, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if cp.returncode != 0:
            return {"error": f"mpi-dp run exit {cp.returncode}: {_tail(cp.stderr)}"}
        with h5py.File(res, "r") as f:
            out[key] = float(f["provenance"].attrs["wall_seconds"])
            if key == "short":
                out["total"] = wall
                out["accuracy"] = accuracy(task, f["models/final"][0])
        res.unlink()
    out["round"] = max(out["long"] - out["short"], 0.0) / a.extra_rounds
    out["startup"] = out["total"] - a.T * out["round"]
    return out


def run_peer(a: argparse.Namespace, task: Task, peer: Peer, py: pathlib.Path) -> dict:
    """The peer's driver in its venv: total from launch to exit, rounds from its stamps."""
    driver = task.folder / f"{peer.name}_driver.py"
    driver.write_text(peer.driver)
    params = task.folder / f"{peer.name}_params.json"
    params.write_text(json.dumps({
        "data": str(task.npz), "N": task.N, "T": a.T, "dim": a.dim + 1, "lr": 1.0 / task.L,
        "clip": task.C, "eps": a.eps, "delta": a.delta, "seed": a.seed,
        "noise_multiplier": task.sigma, "cpus": a.cpus}))
    t0 = time.perf_counter()
    # its own session: on a timeout the whole group goes (Flower's Ray workers and agents too)
    proc = subprocess.Popen([str(py), str(driver), str(params)], cwd=task.folder,
                            env=_peer_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=a.timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return {"error": f"gave up after --timeout {a.timeout:g} s", "timeout": True}
    wall = time.perf_counter() - t0
    _kill_group(proc)  # anything the driver left running
    lines = stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"driver exit {proc.returncode}: {_tail(stderr)}"}
    r = json.loads(lines[-1])
    ends = r["round_ends"]
    if len(ends) != a.T:
        return {"error": f"driver stamped {len(ends)} rounds, not T = {a.T}"}
    per_round = (ends[-1] - ends[0]) / (a.T - 1)
    return {"total": wall, "round": per_round, "startup": wall - a.T * per_round,
            "accuracy": accuracy(task, np.asarray(r["theta"])),
            "noise_multiplier": r["noise_multiplier"], "version": r["version"]}


def _kill_group(proc: subprocess.Popen) -> None:
    """End the process group of `proc` (SIGTERM, then SIGKILL after 5 s) and reap it."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            try:  # the leader is gone; its group may not be
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break


# -- report -----------------------------------------------------------------------------------
def spread(values: list[float], scale: float = 1.0, fmt: str = ".3g") -> str:
    if not values:
        return "-"
    v = [x * scale for x in values]
    return f"{statistics.median(v):{fmt}} [{min(v):{fmt}}, {max(v):{fmt}}]"


def block_line(blk: int, N: int, name: str, r: dict) -> str:
    if "error" in r:
        return f"block {blk} N={N}: {name}: {r['error']}"
    return (f"block {blk} N={N}: {name} total {r['total']:.2f} s, {1e3 * r['round']:.3g} ms/round, "
            f"start-up {r['startup']:.2f} s, test accuracy {r['accuracy']:.4f}")


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    t_start = time.perf_counter()
    print(f"peers{' (quick)' if a.quick else ''}: mpi_dp sync_star on {a.ranks} rank(s) vs "
          f"{', '.join(a.peer_names) or 'no peer'}; N in {a.sizes} owners x {a.records:,} "
          f"records, d = {a.dim} (+ bias), T = {a.T}, eps = {a.eps:g}, delta = {a.delta:g}, "
          f"{a.blocks} block(s); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
          "CPU(s)", flush=True)
    ready: dict[str, pathlib.Path] = {}
    for name in a.peer_names:
        py, text = prepare_peer(a, PEERS[name])
        if py is None:
            print(f"{name}: skipped: {text}", flush=True)
        else:
            ready[name] = py
            print(f"{name}: {text}", flush=True)
    systems = ["mpi_dp", *ready]
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="peers."))
    try:
        tasks = {}
        for N in a.sizes:
            t = tasks[N] = make_task(a, N, tmp)
            print(f"N = {N}: clip xi = {t.xi:.4g} (mpi_dp, L1 per record), C = {t.C:.4g} "
                  f"(peers, L2 per client gradient; update clip lr*C = {t.C / t.L:.4g}), "
                  f"L = {t.L:.4g}, peers' lr = 1/L, Gaussian noise multiplier {t.sigma:.4g} "
                  f"(client level, T = {a.T} rounds)", flush=True)
        rows: dict[tuple[int, str], list[dict]] = {(N, s): [] for N in a.sizes for s in systems}
        gave_up: dict[str, int] = {}  # peer -> the smallest N it timed out at (not run again)
        for blk in range(1, a.blocks + 1):
            for N in a.sizes:
                for s in systems:
                    if s in gave_up and N >= gave_up[s]:  # it did not manage a smaller N
                        r = {"error": f"not run (gave up at N = {gave_up[s]} before)"}
                    else:
                        r = (run_mpi_dp(a, tasks[N]) if s == "mpi_dp"
                             else run_peer(a, tasks[N], PEERS[s], ready[s]))
                    if r.get("timeout"):
                        gave_up[s] = min(N, gave_up.get(s, N))
                    rows[N, s].append(r)
                    print(block_line(blk, N, s, r), flush=True)
        report(a, tasks, systems, rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"done in {time.perf_counter() - t_start:.0f} s")


def report(a: argparse.Namespace, tasks: dict[int, Task], systems: list[str],
           rows: dict[tuple[int, str], list[dict]]) -> None:
    print(f"\nsummary: medians [min, max] over {a.blocks} block(s); ratios peer / mpi_dp per "
          "block (> 1: mpi_dp faster)")
    print(f"{'N':>6}  {'system':<7} {'ms/round':<30} {'start-up s':<22} {'total s':<22} "
          f"{'test acc':<9} {'round ratio':<22} {'total ratio'}")
    goals: list[str] = []
    for N in a.sizes:
        base = rows[N, "mpi_dp"]
        accs: dict[str, float] = {}
        for s in systems:
            ok = [r for r in rows[N, s] if "error" not in r]
            if not ok:
                print(f"{N:>6}  {s:<7} failed: {rows[N, s][0]['error']}")
                continue
            accs[s] = statistics.median(r["accuracy"] for r in ok)
            ratios: dict[str, list[float]] = {"round": [], "total": []}
            if s != "mpi_dp":
                for r, b in zip(rows[N, s], base, strict=True):
                    if "error" not in r and "error" not in b:
                        ratios["total"].append(r["total"] / b["total"])
                        if b["round"] > 0:
                            ratios["round"].append(r["round"] / b["round"])
            print(f"{N:>6}  {s:<7} {spread([r['round'] for r in ok], 1e3):<30} "
                  f"{spread([r['startup'] for r in ok]):<22} "
                  f"{spread([r['total'] for r in ok]):<22} {accs[s]:<9.4f} "
                  f"{spread(ratios['round']) if s != 'mpi_dp' else '1':<22} "
                  f"{spread(ratios['total']) if s != 'mpi_dp' else '1'}")
            if s == "pfl" and ratios["total"]:
                tr = statistics.median(ratios["total"])
                per_round = ("per round: not measured (mpi_dp's round time came out <= 0: the "
                             "machine's load swamped the extra rounds; use more --blocks)"
                             if not ratios["round"] else None)
                if per_round is None:
                    rr = statistics.median(ratios["round"])
                    per_round = (f"per round pfl/mpi_dp = {rr:.3g} (goal >= 3: "
                                 f"{'met' if rr >= 3 else 'NOT met'})")
                goals.append(f"N={N}: total mpi_dp/pfl = {1 / tr:.3g} (goal <= 0.5: "
                             f"{'met' if 1 / tr <= 0.5 else 'NOT met'}), {per_round}")
        if len(accs) > 1:
            gap = max(accs.values()) - min(accs.values())
            text = ", ".join(f"{s} {v:.4f}" for s, v in accs.items())
            t = tasks[N]
            verdict = (f"agree within {a.tolerance:g}" if gap <= a.tolerance
                       else f"DIFFER by {gap:.4f} (more than --tolerance {a.tolerance:g}): the "
                       f"peers' client-level noise on the mean gradient, std sigma C / N = "
                       f"{t.sigma * t.C / N:.3g} per coordinate against its norm <= C = "
                       f"{t.C:.3g}, is the DP unit's price, not less work (a larger --eps or N "
                       "closes the gap)")
            print(f"equal work N={N}: test accuracies {text}: {verdict}")
        elif accs:
            print(f"equal work N={N}: test accuracy mpi_dp {accs.get('mpi_dp', float('nan')):.4f}"
                  " (no peer ran to compare)")
    print(DP_LINE)
    for t in tasks.values():
        pfl_sigma = [r["noise_multiplier"] for r in rows.get((t.N, "pfl"), []) if "error" not in r]
        if pfl_sigma:
            print(f"noise multiplier N={t.N}: this script (exact) {t.sigma:.4g}, pfl's "
                  f"PLDPrivacyAccountant {pfl_sigma[0]:.4g}")
            break
    for g in goals:
        print(f"goal {g}")


if __name__ == "__main__":
    main()
