"""Scaling: start-up and time per iteration of the same records held by 1, 1,000 and 10,000
agents, and start-up, time per iteration, peak memory and parallel efficiency by agents and ranks.

Two tables, both from runs of `mpiexec -n R python benchmarks/scaling.py --worker JOB OUT` (a job
as a user writes it; the worker calls `mpi_dp.runner.run_job` and times it from the outside):

  same records  (--same-records) per method, ONE set of records split over 1, 1,000 and 10,000
                agents (dola and p2p: 64, 1,000 and 10,000; a graph method needs a graph): the
                shard file is made at 10,000 agents x 50 records (`mpi-dp data synth`) and
                regrouped into fewer agents (agent j of K holds source agents j*10000/K ...,
                their records, test sets and per-record extras, in order; the public and global
                test sets are kept), so every case holds the same records. p2p: every count,
                10,000 too, stores a connected random geometric graph of mean degree 10 (the
                synthetic kernel graph cannot be regrouped) and its job sets reference = "none"
                (the evaluation-only optimum Q*). Each case runs on
                --same-ranks ranks (1); the table gives its start-up, ms per iteration and the
                ratio to the smallest agent count, with the issue's goals beside them (ratio at
                10,000 agents <= 3, start-up of 10,000 agents < 2 s on one rank).
  rank grid     (--grid) per method and --agents count (a shard made at that count), on each of
                --ranks: start-up, ms per iteration, peak memory and parallel efficiency (goal at
                16 ranks: >= 0.8, meaningful only with 16 free cores).

Without --same-records or --grid both tables are made.

  start-up    launch of the worker's run_job -> result file opened (job checks, shards read and
              validated, layout, calibration; what a user waits for before any iteration)
  per iter    (configuration 0 done - result file opened) / T: the iterations with their records
              and the configuration's own set-up (references), amortised over T; dola: per round;
              p2p: per round of T x agents wake-ups, i.e. one wake-up of every peer
  steady      (rank grid) the same without the configuration's set-up and close: the time from
              the record at iteration T/2 to the record at T, over T/2 (the grid's jobs record at
              0, T/2 and T; an even T >= 2, else not measured; the same-records table's jobs
              record at 0 and T only, as a record scores every agent). At small T the set-up
              (references, ledger table, result writing) dominates "per iter", and it is serial
              on rank 0, so the steady figure is the one that shows how the iterations
              themselves scale.
              Two methods cannot reach the efficiency goal by construction: an async_star
              iteration is one owner's answer to one query (per run), a message round trip to
              one host, not work the ranks share; p2p's replay runs the seeded schedule in
              conflict-free rounds, each as wide as the wake-ups no earlier one blocks (at
              1,024 peers of degree ~10 about 5 wake-ups a round: 7,042 in 1,439 rounds at
              T = 8), so no more ranks than that can work at once, and each round ends in a
              barrier
  ratio       the case's time / the same block's time at the smallest agent count: star methods
              and admm per iteration (every record once); dola per agent-round (each agent
              steps on one record per round, whatever it holds: per round / agents); p2p per
              round (a wake-up of every peer visits every record once; per agent-round would
              divide by 64 / 10,000 peers holding 156x fewer records each). Both ms per round and
              us per agent-round are printed for dola and p2p.
  peak memory max over ranks of ru_maxrss (resource.getrusage), MiB
  efficiency  per-iteration time on the smallest rank count r0 x r0 / (R x time on R ranks),
              of "per iter" and of "steady"

--tree [LABEL=]DIR (repeatable) runs the worker AND the data commands under another source tree
(PYTHONPATH=DIR; the shard files of each tree are made by that tree's own `mpi-dp data synth` and
shard writer, cached per tree and per content of its mpi_dp/data, rng and pcg modules, since the
shard layout may differ between trees); --baseline-tree DIR is `--tree before=DIR --tree
after=<this checkout>`. Cases of all trees are interleaved in --repeat blocks (3; the tree order
rotates from block to block) and every figure is the median over the blocks with its spread
(min-max), because a shared machine is noisy. Every tree's mpi_dp package is copied first to
DATA_DIR/trees (named by its content; the runs use the copy, so a read-only tree is not compiled
on every start and edits during the run do not mix in), byte-compiled, and every method runs
once untimed per tree (numba caches, page cache) before the timed blocks.

Nothing is asserted. Ranks beyond os.cpu_count() are oversubscribed: efficiency there measures
the oversubscription, not the code (the output says so); with other jobs on the machine even
fewer cores are free (the load average is printed).

    python benchmarks/scaling.py --same-records --baseline-tree /tmp/wt_base   # before/after
    python benchmarks/scaling.py --grid --ranks 1,4,16                          # efficiency
    python benchmarks/scaling.py --same-records --methods sync_star --repeat 1 --T 4 \
        --same-agents 1,100,1000                                                # smoke test
    python benchmarks/scaling.py --grid --methods dola --agents 10000 --ranks 8 --T 4
    python benchmarks/scaling.py --quick     # both tables, smallest case (tests/test_benchmarks.py)

--quick: both tables at the smallest meaningful case, QUICK below (sync_star, the same records as
1 and 4 agents, the grid at 4 agents on 1 rank, T = 2, one run, one block), without the untimed
warm-up runs; options given explicitly win.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METHODS = ("sync_star", "async_star", "admm", "dola", "p2p")
GRAPH_METHODS = ("dola", "p2p")
ROOT = Path(__file__).resolve().parents[1]
#: agent counts of the same-records table (the records are made at the largest)
SAME_AGENTS = (1, 1000, 10000)
#: the smallest agent count of a graph method in the same-records table
GRAPH_BASE = 64
#: mean degree of the random geometric graph stored with every p2p same-records shard
P2P_DEGREE = 10.0
#: the numbers of the records at T/2 and T (record_every = T/2): the star methods and admm
#: record at 0, T/2, T; dola at T/2, T; p2p at 0, T/2, T and once more after the replay
STEADY_RECORDS = {"dola": (1, 2)}
#: the issue's goals
GOAL_RATIO, GOAL_STARTUP_S, GOAL_EFFICIENCY, GOAL_RANKS = 3.0, 2.0, 0.8, 16
#: --quick: the smallest meaningful case of both tables (options given explicitly win)
QUICK = {"methods": "sync_star", "same_agents": "1,4", "agents": "4", "ranks": "1", "T": 2,
         "runs": 1, "repeat": 1}


# -- jobs and data -----------------------------------------------------------------------------
def synth_args(method: str, agents: int) -> list[str]:
    """`mpi-dp data synth` options of the method's synthetic problem at `agents` agents."""
    common = ["--agents", str(agents), "--seed", "1"]
    if method in ("sync_star", "async_star"):
        return ["--task", "regression", "--records", "50", "--dim", "10", "--noise", "0.5",
                "--public", "1000", *common]
    if method == "admm":
        return ["--task", "multiclass", "--classes", "3", "--records", "50", "--dim", "10",
                "--public", "1000", *common]
    if method == "dola":
        return ["--task", "online", "--records", "50", "--dim", "10", "--noise", "0.05",
                "--public", "1000", *common]
    return ["--task", "p2p", "--dim", "10", *common]


def job_text(method: str, data: Path, out: Path, T: int, runs: int, agents: int,
             same: bool = False) -> str:
    """A small job of `method` on `data`: T iterations (dola: rounds; p2p: T x agents wake-ups,
    i.e. T per agent), `runs` runs. `same` (the same-records table): p2p skips its
    evaluation-only optimum Q* (`reference = "none"`); its graph is the shard's (there: a random
    geometric graph of mean degree P2P_DEGREE at every agent count, see `regroup`)."""
    # the rank grid's jobs record at 0, T/2 and T (see "steady"); the same-records table's at 0
    # and T only: a record scores every agent, and its ratios compare the iterations
    every = T // 2 if not same and T >= 2 and T % 2 == 0 else T
    head = (f'name = "scaling_{method}"\nalgorithm = "{method}"\ndata = "{data}"\n'
            f'output = "{out}"\nseed = 7\nruns = {runs}\neps = 1.0\n')
    if method == "sync_star":
        return head + (f'variant = "alg2"\nT = {T}\nloss = "squared"\nlam = 1e-2\n'
                       f'theta_max = 1e6\nxi = "auto"\nrecord_every = {every}\n')
    if method == "async_star":
        return head + (f'variant = "proof"\nT = {T}\nloss = "squared"\nlam = 1e-2\n'
                       f'theta_max = 1e6\nxi = "auto"\nrecord_every = {every}\n')
    if method == "admm":
        return head + f'variant = "iadmm"\nT = {T}\nrecord_every = {every}\n'
    if method == "dola":
        return head + f'T = {T}\nrecord_every = {every}\n'
    extra = 'reference = "none"\n' if same else ""
    return head + f'T = {T * agents}\nrecord_every = {every * agents}\n\n[p2p]\nmu = 1.0\n{extra}'


@dataclass(frozen=True)
class Tree:
    """A source tree the worker and the data commands run under (PYTHONPATH): `path` holds the
    snapshot of `source`'s mpi_dp package that the runs use."""

    label: str
    path: Path
    source: Path

    def fingerprint(self) -> str:
        """A hash of what decides the shard files: the data package, rng and pcg modules."""
        pkg = self.path / "mpi_dp"
        return content_hash(pkg, [*(pkg / "data").rglob("*.py"), pkg / "rng.py", pkg / "pcg.py"])

    def env(self) -> dict[str, str]:
        """The environment of a command under this tree."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.path), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
        return env


def content_hash(root: Path, files: list[Path]) -> str:
    h = hashlib.sha1()
    for f in sorted(files):
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:10]


def snapshot(label: str, source: Path, data_dir: Path) -> Tree:
    """A copy of `source`/mpi_dp (without bytecode) under DATA_DIR/trees, named by its content:
    the runs write their bytecode and numba caches there and never into the tree, and edits to
    the tree during the run do not mix into it."""
    pkg = source / "mpi_dp"
    dest = data_dir / "trees" / f"{label}-{content_hash(pkg, list(pkg.rglob('*')))}"
    if not (dest / "mpi_dp").is_dir():
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(pkg, tmp / "mpi_dp",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        tmp.rename(dest)
    return Tree(label, dest, source)


def run_under(tree: Tree, args: list[str], data_dir: Path, timeout: float) -> None:
    """`python ARGS` under `tree`; a failure raises with the command's last error line."""
    cp = subprocess.run([sys.executable, *args], env=tree.env(), capture_output=True,
                        text=True, timeout=timeout, cwd=data_dir)  # not a tree: `-m` puts cwd first
    if cp.returncode != 0:
        tail = (cp.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{tree.label}: {' '.join(args[:4])} ...: {tail}")


def tree_dir(tree: Tree, data_dir: Path) -> Path:
    d = data_dir / f"{tree.label}-{tree.fingerprint()}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def make_data(method: str, agents: int, tree: Tree, a: argparse.Namespace) -> Path:
    """The method's synthetic shard file at `agents` agents, made by `tree` (cached)."""
    task = synth_args(method, agents)[1]
    path = tree_dir(tree, a.data_dir) / f"{task}_{agents}.h5"
    if not path.exists():
        t = time.perf_counter()
        run_under(tree, ["-m", "mpi_dp", "data", "synth", *synth_args(method, agents),
                         "--out", str(path)], a.data_dir, a.timeout)
        print(f"  ({tree.label}: made {path.name} in {time.perf_counter() - t:.1f} s)",
              flush=True)
    return path


def make_same_data(method: str, agents: int, tree: Tree, a: argparse.Namespace) -> Path:
    """The records of `make_data(method, max(--same-agents))` regrouped into `agents` agents;
    p2p: every count (the largest too) with a stored random geometric graph of mean degree
    P2P_DEGREE."""
    source = make_data(method, max(a.same_agents), tree, a)
    if agents == max(a.same_agents) and method != "p2p":
        return source
    path = source.with_name(f"{source.stem}_as_{agents}.h5")
    if not path.exists():
        t = time.perf_counter()
        graph = ["--graph-degree", str(P2P_DEGREE)] if method == "p2p" else []
        run_under(tree, [__file__, "--regroup", str(source), str(path), str(agents), *graph],
                  a.data_dir, a.timeout)
        print(f"  ({tree.label}: regrouped {source.name} into {agents:,} agents in "
              f"{time.perf_counter() - t:.1f} s)", flush=True)
    return path


def prepared(make: Any, method: str, agents: int, tree: Tree,
             a: argparse.Namespace) -> Path | None:
    """`make(method, agents, tree, a)`, or None (printed) when the tree's data commands fail
    (the cases on it then fail without running)."""
    try:
        return make(method, agents, tree, a)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"  DATA FAILED ({method}, {agents:,} agents): {exc}", flush=True)
        return None


def regroup(source: str, dest: str, agents: int, graph_degree: float | None = None) -> None:
    """Write the records of shard file `source` as `agents` agents to `dest`, with the shard API
    of the tree on PYTHONPATH: agent j holds the source agents of np.array_split(range(n),
    agents)[j] (records, test sets, per-record extras concatenated in order). Public records,
    the global test set and root attributes are kept; graph arrays and per-agent public arrays
    (one row per source agent) are dropped, since they describe the source's agents.
    `graph_degree`: store a connected random geometric graph of that mean degree on the new
    agents (comm.topology.geometric, seed 1; weight 1 per edge) as the shard's graph."""
    import numpy as np
    import scipy.sparse as sp

    from mpi_dp.data.shards import RESERVED_ATTRS, ShardFile, write_shards

    def cat(parts: list[Any]) -> Any:
        return sp.vstack(parts, format="csr") if sp.issparse(parts[0]) else np.concatenate(parts)

    with ShardFile(source) as f:
        n = f.n_agents
        groups = np.array_split(np.arange(n), agents)
        pairs, tests, extras = [], [], []
        for ids in groups:
            own = [f.read_agent(int(i)) for i in ids]
            pairs.append((cat([X for X, _ in own]), cat([y for _, y in own])))
            if all(f.has_test(int(i)) for i in ids):
                tt = [f.read_agent_test(int(i)) for i in ids]
                tests.append((cat([X for X, _ in tt]), cat([y for _, y in tt])))
            else:
                tests.append(None)
            names = f.agent_extra_names(int(ids[0]))
            extras.append({name: cat([f.read_agent_extra(int(i), name) for i in ids])
                           for name in names if not name.endswith("_meta")})
        def has(name: str) -> bool:  # a property here, maybe a method in another tree
            v = getattr(f, name)
            return bool(v() if callable(v) else v)

        public = f.read_public() if has("has_public") else None
        pub_extra = {}
        for name in f.public_extra_names():
            arr = f.read_public_extra(name)
            if name.startswith("graph") or (arr.ndim and arr.shape[0] == n and n > 1):
                continue  # the source's graph or one row per source agent
            pub_extra[name] = arr
        glob = f.read_test() if has("has_global_test") else None
        attrs = {k: v for k, v in f.attrs.items() if k not in RESERVED_ATTRS and k != "graph"}
        attrs["regrouped"] = json.dumps({"from_agents": n, "agents": agents})
        if graph_degree is not None:
            from mpi_dp.comm.topology import geometric
            from mpi_dp.data.shard_graph import graph_arrays

            g = geometric(agents, graph_degree, 1)
            e = np.asarray(g.edges)
            pub_extra.update(graph_arrays(sp.coo_matrix(
                (np.ones(len(e)), (e[:, 0], e[:, 1])), shape=(agents, agents))))
            attrs["graph"] = json.dumps({"kind": "random_geometric", "mean_degree":
                                         2 * len(e) / agents, "seed": 1})
        write_shards(dest, pairs, public=public, task=f.task, feature_names=f.feature_names,
                     source=f"{f.source}, regrouped into {agents} agents", attrs=attrs,
                     public_extra=pub_extra, test=tests if any(t is not None for t in tests)
                     else None, agent_extra=extras if any(extras) else None, test_global=glob)


# -- worker (under mpiexec) ----------------------------------------------------------------------
def worker(job: str, out: str) -> None:
    """Run `job` with `run_job` of the tree on PYTHONPATH; rank 0 prints the SCALING line."""
    from mpi4py import MPI

    import mpi_dp
    from mpi_dp.results import recorder
    from mpi_dp.runner import run_job

    comm = MPI.COMM_WORLD
    marks: dict[str, float] = {}
    records: dict[int, float] = {}  # configuration 0's records: first beat of each
    beat, done = recorder.ResultFile.beat, recorder.ResultFile.config_done

    def timed_beat(self, config, record, force=False):
        now = time.perf_counter()
        marks.setdefault("opened", now)
        if config == 0 and record > 0 and "done" not in marks:
            records.setdefault(int(record), now)
        return beat(self, config, record, force)

    def timed_done(self, index):
        marks.setdefault("done", time.perf_counter())
        return done(self, index)

    recorder.ResultFile.beat, recorder.ResultFile.config_done = timed_beat, timed_done
    params = inspect.signature(run_job).parameters
    kw = {k: v for k, v in (("comm", comm), ("progress", False), ("overwrite", True))
          if k in params}
    comm.Barrier()
    t0 = time.perf_counter()
    run_job(Path(job), [], out, **kw)
    rss = comm.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, root=0)
    if comm.Get_rank() == 0:
        if "opened" not in marks or "done" not in marks:
            raise RuntimeError("the result file's beat / config_done were not called: the "
                               "worker's timing hooks do not fit this tree")
        print("SCALING " + json.dumps({"startup": marks["opened"] - t0,
                                       "config": marks["done"] - marks["opened"],
                                       "records": sorted(records.items()),
                                       "peak_mib": max(rss),
                                       "package": str(Path(mpi_dp.__file__).parent)}), flush=True)


# -- driver ----------------------------------------------------------------------------------------
def run_case(method: str, data: Path | None, agents: int, ranks: int, tree: Tree,
             a: argparse.Namespace, same: bool, untimed: bool = False) -> dict | None:
    """One run of the worker; its SCALING figures, or None (printed) when it failed."""
    if data is None:
        return None
    work = tree_dir(tree, a.data_dir) / "runs"
    work.mkdir(exist_ok=True)
    tag = f"{method}_{agents}_{ranks}{'_same' if same else ''}"
    out = work / f"{tag}.h5"
    for p in (out, out.with_name(out.name + ".partial")):
        p.unlink(missing_ok=True)
    job = work / f"{tag}.toml"
    job.write_text(job_text(method, data, out, a.T, a.runs, agents, same))
    mpiexec = a.mpiexec or shutil.which("mpiexec", path=str(Path(sys.executable).parent)) \
        or "mpiexec"
    cmd = [mpiexec, "-n", str(ranks), sys.executable, __file__, "--worker", str(job), str(out)]
    what = (f"{'(warm-up) ' if untimed else ''}{tree.label} {method} {agents:,} agents "
            f"{ranks} rank(s)")
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout,
                            env=tree.env(), cwd=work)
    except subprocess.TimeoutExpired:
        print(f"  {what}: TIMED OUT after {a.timeout:.0f} s", flush=True)
        return None
    # (Open MPI's output forwarding may put terminal escapes before it on the same line)
    line = next((ln[ln.index("SCALING "):] for ln in cp.stdout.splitlines()
                 if "SCALING " in ln), None)
    if cp.returncode != 0 or line is None:
        log = out.with_suffix(".log")
        log.write_text(f"$ {' '.join(cmd)}\nexit status {cp.returncode}\n-- stdout\n{cp.stdout}"
                       f"\n-- stderr\n{cp.stderr}")
        tail = (cp.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        print(f"  {what}: FAILED (exit status {cp.returncode}; output in {log}): {tail}",
              flush=True)
        return None
    res = json.loads(line[len("SCALING "):])
    if Path(res["package"]).resolve() != tree.path / "mpi_dp":
        print(f"  {what}: FAILED: the worker ran {res['package']}, not {tree.path}", flush=True)
        return None
    res["iter_ms"] = 1e3 * res["config"] / a.T
    marks = dict(res.get("records", []))  # record number -> first beat (job_text: every T/2)
    k = STEADY_RECORDS.get(method, (2, 3))
    res["steady_ms"] = (1e3 * (marks[k[1]] - marks[k[0]]) / (a.T // 2)
                        if not same and a.T >= 2 and a.T % 2 == 0 and k[1] in marks
                        and k[0] in marks
                        else None)
    steady = "" if res["steady_ms"] is None else f" ({res['steady_ms']:,.1f} steady)"
    print(f"  {what}: start-up {res['startup']:.2f} s, {res['iter_ms']:,.1f} ms/iter{steady}, "
          f"{res['peak_mib']:.0f} MiB", flush=True)
    return res


def warm_up(cases: list[tuple[str, int, int]], data: dict[Any, Path | None], trees: list[Tree],
            a: argparse.Namespace, same: bool) -> None:
    """Byte-compile every tree, then run each (method, agents, ranks) of `cases` once per tree
    on data[method, agents, tree label], untimed, so that no timed case compiles (bytecode,
    numba's cache) or reads cold files. --quick: none."""
    if a.quick:
        return
    for tree in trees:
        try:
            run_under(tree, ["-m", "compileall", "-q", str(tree.path / "mpi_dp")], a.data_dir,
                      a.timeout)
        except RuntimeError as exc:  # a file that does not compile: its cases will say so
            print(f"  (compiling {tree.label} failed: {exc})", flush=True)
        for m, n, r in cases:
            run_case(m, data[m, n, tree.label], n, r, tree, a, same, untimed=True)


def spread(values: list[float], fmt: str) -> str:
    """'median (min-max)' of `values` in format `fmt`; '-' when empty."""
    if not values:
        return "-"
    med = format(statistics.median(values), fmt)
    if len(values) == 1:
        return med
    return f"{med} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def rotated(trees: list[Tree], block: int) -> list[Tree]:
    k = block % len(trees)
    return trees[k:] + trees[:k]


def same_counts(method: str, agents: list[int]) -> list[int]:
    """The agent counts of `method` in the same-records table: `agents`, sorted; a graph
    method's smallest one is GRAPH_BASE (when that is below the others)."""
    counts = sorted(agents)
    if method in GRAPH_METHODS and len(counts) > 1 and GRAPH_BASE < counts[1]:
        counts[0] = GRAPH_BASE
    return counts


def unit(method: str, res: dict, agents: int) -> float:
    """The figure the same-records ratio compares (see the module's docstring)."""
    return res["iter_ms"] * 1e3 / agents if method == "dola" else res["iter_ms"]


def same_records(methods: list[str], trees: list[Tree], a: argparse.Namespace) -> None:
    """The same-records table: interleaved blocks, then medians and spreads."""
    ranks = a.same_ranks
    print(f"\n== same records, {ranks} rank(s), T = {a.T}, runs = {a.runs}, {a.repeat} block(s); "
          f"trees: {', '.join(f'{t.label} = {t.source} (as {t.path})' for t in trees)}",
          flush=True)
    data: dict[tuple[str, int, str], Path | None] = {}
    for m in methods:
        for n in same_counts(m, a.same_agents):
            for tree in trees:
                data[m, n, tree.label] = prepared(make_same_data, m, n, tree, a)
    warm_up([(m, same_counts(m, a.same_agents)[0], ranks) for m in methods], data, trees, a,
            same=True)
    res: dict[tuple[str, int, str], list[dict | None]] = {k: [] for k in data}
    for block in range(a.repeat):
        print(f"block {block + 1}/{a.repeat} (load average {os.getloadavg()[0]:.1f})", flush=True)
        for m in methods:
            for n in same_counts(m, a.same_agents):
                for tree in rotated(trees, block):
                    res[m, n, tree.label].append(
                        run_case(m, data[m, n, tree.label], n, ranks, tree, a, same=True))
    base_label = trees[0].label
    vs_head = f" {base_label + '/this':>17}" if len(trees) > 1 else ""
    print(f"\n{'method':<11} {'agents':>7} {'tree':<8} {'start-up s':>17} {'ms/iter':>24} "
          f"{'us/agent-iter':>16} {'ratio':>17}{vs_head}  goal")
    for m in methods:
        counts = same_counts(m, a.same_agents)
        for n in counts:
            for tree in trees:
                runs = res[m, n, tree.label]
                ok = [r for r in runs if r is not None]
                first = res[m, counts[0], tree.label]
                ratios = [unit(m, r, n) / unit(m, b, counts[0])
                          for r, b in zip(runs, first, strict=True) if r and b]
                goal = "(base of the ratio)" if n == counts[0] else ""
                if n == counts[-1]:
                    goal = f"ratio <= {GOAL_RATIO:g}: " + (
                        "no data" if not ratios else
                        "met" if statistics.median(ratios) <= GOAL_RATIO else "NOT met")
                    if ranks == 1 and ok and n >= max(SAME_AGENTS):
                        su = statistics.median(r["startup"] for r in ok)
                        goal += (f"; start-up < {GOAL_STARTUP_S:g} s: "
                                 f"{'met' if su < GOAL_STARTUP_S else 'NOT met'}")
                per_agent = (spread([1e3 * r["iter_ms"] / n for r in ok], ",.1f")
                             if m in GRAPH_METHODS else "")
                vs = ""
                if len(trees) > 1:
                    base = res[m, n, base_label]
                    vs = " " + format(spread(
                        [b["iter_ms"] / r["iter_ms"] for r, b in zip(runs, base, strict=True)
                         if r and b], ".2f") if tree.label != base_label else "", ">17")
                print(f"{m:<11} {n:>7,} {tree.label:<8} "
                      f"{spread([r['startup'] for r in ok], '.2f'):>17} "
                      f"{spread([r['iter_ms'] for r in ok], ',.1f'):>24} {per_agent:>16} "
                      f"{spread(ratios, '.2f') if n != counts[0] else '1':>17}{vs}  "
                      f"{goal}".rstrip(), flush=True)
    print(f"ratio: to the {min(a.same_agents)}-agent case of the same block and tree (dola, p2p: "
          f"{GRAPH_BASE} agents); star methods and admm per iteration, dola per agent-round, p2p "
          "per round (one wake-up of every peer). Medians over the blocks (min-max).")


def grid(methods: list[str], agents: list[int], ranks: list[int], trees: list[Tree],
         a: argparse.Namespace) -> None:
    """The rank grid: every (method, agents) on every rank count, blocks interleaved."""
    cores = os.cpu_count() or 1
    print(f"\n== rank grid, T = {a.T}, runs = {a.runs}, {a.repeat} block(s), {cores} core(s), "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    if max(ranks) > cores:
        print(f"WARNING: {max(ranks)} ranks > os.cpu_count() = {cores}: the cases marked * are "
              "oversubscribed, their efficiency measures the oversubscription, not the code "
              f"(the goal, >= {GOAL_EFFICIENCY:g} at {GOAL_RANKS} ranks, needs {GOAL_RANKS} "
              "free cores)", flush=True)
    data = {(m, n, t.label): prepared(make_data, m, n, t, a)
            for m in methods for n in agents for t in trees}
    warm_up([(m, agents[0], ranks[0]) for m in methods], data, trees, a, same=False)
    res: dict[tuple[str, int, str, int], list[dict | None]] = {
        (m, n, t.label, r): [] for m in methods for n in agents for t in trees for r in ranks}
    for block in range(a.repeat):
        print(f"block {block + 1}/{a.repeat} (load average {os.getloadavg()[0]:.1f})", flush=True)
        for m in methods:
            for n in agents:
                for r in ranks:
                    for t in rotated(trees, block):
                        res[m, n, t.label, r].append(
                            run_case(m, data[m, n, t.label], n, r, t, a, same=False))
    print(f"\n{'method':<11} {'agents':>7} {'tree':<8} {'ranks':>6} {'start-up s':>17} "
          f"{'ms/iter':>24} {'steady ms/iter':>24} {'peak MiB/rank':>13} {'efficiency':>17} "
          f"{'steady eff.':>17}")
    for m in methods:
        for n in agents:
            for t in trees:
                first = res[m, n, t.label, ranks[0]]
                for r in ranks:
                    runs = res[m, n, t.label, r]
                    ok = [x for x in runs if x is not None]
                    eff = [b["iter_ms"] * ranks[0] / (r * x["iter_ms"])
                           for x, b in zip(runs, first, strict=True) if x and b]
                    steady = [x["steady_ms"] for x in ok if x.get("steady_ms")]
                    s_eff = [b["steady_ms"] * ranks[0] / (r * x["steady_ms"])
                             for x, b in zip(runs, first, strict=True)
                             if x and b and x.get("steady_ms") and b.get("steady_ms")]
                    mark = "*" if r > cores else ""
                    goal = ""
                    if r == GOAL_RANKS and (eff or s_eff):
                        met = [f"{name} {'met' if statistics.median(e) >= GOAL_EFFICIENCY else 'NOT met'}"
                               for name, e in (("per iter", eff), ("steady", s_eff)) if e]
                        goal = f"goal >= {GOAL_EFFICIENCY:g}: {', '.join(met)}"
                        if r > cores:
                            goal += " (oversubscribed: not meaningful)"
                    print(f"{m:<11} {n:>7,} {t.label:<8} {str(r) + mark:>6} "
                          f"{spread([x['startup'] for x in ok], '.2f'):>17} "
                          f"{spread([x['iter_ms'] for x in ok], ',.1f'):>24} "
                          f"{spread(steady, ',.1f'):>24} "
                          f"{spread([x['peak_mib'] for x in ok], '.0f'):>13} "
                          f"{spread(eff, '.2f'):>17} {spread(s_eff, '.2f'):>17} "
                          f"{goal}".rstrip(), flush=True)
    print(f"efficiency: per-iteration time on {ranks[0]} rank(s) x {ranks[0]} / (R x per-iteration "
          "time on R ranks), per block; steady: the same of the steady figures (the iterations "
          "from T/2 to T, without the configuration's set-up and close); * = more ranks than "
          "cores")


def parse_tree(text: str, n: int) -> tuple[str, Path]:
    """--tree [LABEL=]DIR -> (label, directory)."""
    label, _, path = text.rpartition("=")
    p = Path(path).expanduser().resolve()
    if not (p / "mpi_dp" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"--tree {text}: {p} holds no mpi_dp package")
    return label or (p.name if p != ROOT else "current") or f"tree{n}", p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--worker", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--regroup", nargs=3, metavar=("SRC", "DST", "AGENTS"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--graph-degree", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated methods")
    ap.add_argument("--same-records", action="store_true",
                    help="only the same-records table (1 / 1,000 / 10,000 agents)")
    ap.add_argument("--grid", action="store_true", help="only the rank grid")
    ap.add_argument("--same-agents", default=",".join(map(str, SAME_AGENTS)),
                    help="comma-separated agent counts of the same-records table (the records "
                    f"are made at the largest; dola and p2p: the smallest is {GRAPH_BASE})")
    ap.add_argument("--same-ranks", type=int, default=1,
                    help="ranks of the same-records runs (default 1)")
    ap.add_argument("--agents", default="16,1024,10000",
                    help="comma-separated agent counts of the rank grid")
    ap.add_argument("--ranks", default="1,2,4,8",
                    help="comma-separated rank counts of the rank grid, e.g. 1,4,16")
    ap.add_argument("--T", type=int, default=10, help="iterations (rounds; p2p: wake-ups per "
                    "agent) per run")
    ap.add_argument("--runs", type=int, default=2, help="Monte-Carlo runs")
    ap.add_argument("--repeat", type=int, default=3,
                    help="blocks of interleaved cases (median and spread over them)")
    ap.add_argument("--tree", action="append", default=[], metavar="[LABEL=]DIR",
                    help="run under this source tree (repeatable; default: this checkout)")
    ap.add_argument("--baseline-tree", metavar="DIR",
                    help="= --tree before=DIR --tree after=<this checkout>")
    ap.add_argument("--mpiexec", help="the mpiexec to launch the workers with (default: the one "
                    "beside this Python, else the first on PATH); it must belong to the MPI that "
                    "mpi4py links")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    ap.add_argument("--data-dir", type=Path, default=Path("/tmp/mpi_dp_scaling"),
                    help="where shard files are cached and jobs run")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test (tests/test_benchmarks.py): "
                    + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                    + ", no warm-up runs (options given explicitly win)")
    a = ap.parse_args(argv)
    if a.quick:  # the smoke-test sizes, where not given explicitly
        for k, v in QUICK.items():
            if getattr(a, k) == ap.get_default(k):
                setattr(a, k, v)
    if a.worker:
        worker(*a.worker)
        return 0
    if a.regroup:
        regroup(a.regroup[0], a.regroup[1], int(a.regroup[2]), a.graph_degree)
        return 0
    methods = [m for m in a.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        ap.error(f"unknown method(s) {bad}; choose from {', '.join(METHODS)}")
    specs = list(a.tree)
    if a.baseline_tree:
        specs = [f"before={a.baseline_tree}", f"after={ROOT}", *specs]
    try:
        named = [parse_tree(s, i) for i, s in enumerate(specs or [f"current={ROOT}"])]
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    if len({label for label, _ in named}) != len(named):
        ap.error("two trees have the same label; name them --tree LABEL=DIR")
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    a.same_agents = sorted({int(v) for v in a.same_agents.split(",")})
    a.data_dir = a.data_dir.resolve()
    a.data_dir.mkdir(parents=True, exist_ok=True)
    trees = [snapshot(label, path, a.data_dir) for label, path in named]
    both = not (a.same_records or a.grid)
    print(f"scaling{' (quick: no warm-up runs)' if a.quick else ''}: {os.cpu_count()} core(s), "
          "load average "
          f"{' / '.join(f'{v:.1f}' for v in os.getloadavg())} (1 / 5 / 15 min)", flush=True)
    t = time.perf_counter()
    if a.same_records or both:
        same_records(methods, trees, a)
    if a.grid or both:
        grid(methods, [int(v) for v in a.agents.split(",")],
             sorted(int(v) for v in a.ranks.split(",")), trees, a)
    print(f"\ndone in {time.perf_counter() - t:.0f} s, load average now "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
