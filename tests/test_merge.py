"""A sweep split into blocks of configurations (`mpi-dp run --configs A:B / --config-block I/N`,
slurm/sweep.sbatch's array tasks) and merged (`mpi-dp merge`) equals the whole job's file: every
dataset byte for byte; attributes too, except those naming the writer and its times (DIFFERS)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import (
    HANG_GUARD_S,
    mpi_run,
    read_datasets,
    start_when_requeued,
    wait_for_progress,
    write_job,
)
from test_slurm import SLURM_MARKS, _wait_gone

from mpi_dp.results.output import partial_path

SWEEP = Path(__file__).resolve().parents[1] / "slurm" / "sweep.sbatch"

#: the only attributes in which a merged file may differ from the single job's: who wrote it and
#: when (root heartbeat, merged_from; provenance), the ranks of its parts, and the wall times a
#: method records per configuration (they differ between any two runs)
DIFFERS = {"/": {"writer_pid", "writer_host", "heartbeat_unix", "merged_from"},
           "provenance": {"command", "start_time", "end_time", "wall_seconds", "n_ranks", "hosts"},
           "configs": {"seconds", "exchange_seconds"}}


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpi_dp", *args], capture_output=True, text=True,
                          timeout=HANG_GUARD_S, env=dict(os.environ, **(env or {})))


def _attrs(path: Path) -> dict[str, dict]:
    """Every object's attributes; the dimension-scale links (object references) as the names of
    the objects they point to, so that two files compare by what their dimensions are."""
    out: dict[str, dict] = {}

    def plain(f: h5py.File, key: str, v):
        if key == "DIMENSION_LIST":
            return [[f[r].name for r in refs] for refs in v]
        if key == "REFERENCE_LIST":
            return sorted((f[r].name, int(k)) for r, k in v)
        return v

    with h5py.File(path, "r") as f:
        out["/"] = dict(f.attrs)
        f.visititems(lambda name, obj: out.__setitem__(
            name, {k: plain(f, k, v) for k, v in obj.attrs.items()}))
    return out


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "fc" and b.dtype.kind in "fc":
        return a.shape == b.shape and a.tobytes() == b.tobytes()  # NaN equals NaN, bit for bit
    return a.shape == b.shape and bool(np.all(a == b))


def assert_equal_results(whole: Path, merged: Path) -> None:
    """Every dataset byte-equal; every attribute equal except those in DIFFERS."""
    a, b = read_datasets(whole), read_datasets(merged)
    assert sorted(a) == sorted(b) and a
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        if a[k].dtype == object:  # text: the strings (an object array's bytes are pointers)
            assert a[k].tolist() == b[k].tolist(), k
        else:
            assert a[k].tobytes() == b[k].tobytes(), k
    ta, tb = _attrs(whole), _attrs(merged)
    assert sorted(ta) == sorted(tb)
    for obj in ta:
        skip = DIFFERS.get("/" if obj == "/" else obj.split("/")[0], set())
        names = set(ta[obj]) - skip
        assert names == set(tb[obj]) - skip, obj
        for name in names:
            assert _same(ta[obj][name], tb[obj][name]), (obj, name, ta[obj][name], tb[obj][name])


def _sweep_job(tmp_path: Path, small_shards: Path, **keys) -> Path:
    """sync_star over eps x n: 4 configurations, two of each n (the reference per n is cached in
    a whole run and computed afresh in a block)."""
    return write_job(tmp_path / "s.toml", small_shards, T=12, runs=2, record_every=3,
                     sweep={"eps": [0.5, 2.0], "n": [300, 500]}, **keys)


def _whole(job: Path, ranks: int) -> Path:
    """The job run whole to its own output, moved aside to whole.h5 (attributes unchanged)."""
    out = job.with_suffix(".h5")
    cp = mpi_run(ranks, ["run", str(job), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    return out.rename(job.with_name("whole.h5"))


def test_a_sweep_run_in_blocks_and_merged_equals_the_whole_run(tmp_path, small_shards):
    """Whole on 3 ranks; blocks 0/3 (serial), 1/3 and 2/3 (2 ranks) into s.taskI.h5; `mpi-dp
    merge s.h5` finds them, and the merged file equals the whole one; analyze reads it."""
    job = _sweep_job(tmp_path, small_shards)
    whole = _whole(job, 3)
    cp = _cli("run", str(job), "--config-block", "0/3", "--task-file")
    assert cp.returncode == 0, cp.stderr
    assert "block 0/3: configuration 1 of 4 (index 0)" in cp.stderr
    for i in (1, 2):
        cp = mpi_run(2, ["run", str(job), "--config-block", f"{i}/3", "--task-file", "--quiet"])
        assert cp.returncode == 0, cp.stderr
    with h5py.File(tmp_path / "s.task2.h5", "r") as f:
        assert f.attrs["status"] == "complete" and list(f["configs"]) == ["002", "003"]
        assert list(f.attrs["config_block"]) == [2, 4] and list(f.attrs["config_task"]) == [2, 3]
    cp = _cli("analyze", str(tmp_path / "s.task1.h5"))
    assert cp.returncode == 0 and "PART: " in cp.stderr and "configurations 1:2 of the job's 4" \
        in cp.stderr, cp.stderr
    cp = _cli("merge", str(tmp_path / "s.h5"))
    assert cp.returncode == 0, cp.stderr
    assert "merged 3 part(s), 4 configuration(s)" in cp.stderr
    merged = tmp_path / "s.h5"
    assert not partial_path(merged).exists()
    assert_equal_results(whole, merged)
    with h5py.File(merged, "r") as f:
        assert f.attrs["status"] == "complete" and "config_block" not in f.attrs
        parts = json.loads(f.attrs["merged_from"])
    assert [p["config_block"] for p in parts] == [[0, 1], [1, 2], [2, 4]]
    assert [Path(p["path"]).name for p in parts] == [f"s.task{i}.h5" for i in range(3)]
    assert [p["n_ranks"] for p in parts] == [1, 2, 2]
    cp = _cli("analyze", str(merged))
    assert cp.returncode == 0, cp.stderr
    assert "status complete, 4 configurations" in cp.stdout
    assert "PART" not in cp.stderr and "incomplete" not in cp.stderr.lower(), cp.stderr


@pytest.mark.parametrize("method", ["dola", "p2p"])
def test_a_graph_method_split_in_blocks_merges_into_the_whole_run(tmp_path, small_shards, method):
    """The graph methods (ranks host agents, MPI graph topologies / RMA): --configs 0:1 and 1:
    on 2 ranks, merged from a directory, equal the whole run on 2 ranks."""
    from test_outputs import _resume_jobs

    job = _resume_jobs(tmp_path, small_shards)[method]
    whole = _whole(job, 2)
    (tmp_path / "parts").mkdir()
    for name, block in (("a", "0:1"), ("b", "1:")):
        cp = mpi_run(2, ["run", str(job), "--configs", block, "--out",
                         str(tmp_path / "parts" / f"{name}.h5"), "--quiet"])
        assert cp.returncode == 0, cp.stderr
    merged = tmp_path / "merged.h5"
    cp = _cli("merge", str(merged), str(tmp_path / "parts"), "--quiet")
    assert cp.returncode == 0, cp.stderr
    # the parts ran with --out: their job text names that output (# --set output=...), so the
    # merged root attributes job and job_resolved are the first part's, not the whole run's
    with h5py.File(merged, "r+") as f, h5py.File(whole, "r") as w:
        assert json.loads(f.attrs["job_resolved"])["output"].endswith("parts/a.h5")
        f.attrs["job"], f.attrs["job_resolved"] = w.attrs["job"], w.attrs["job_resolved"]
    assert_equal_results(whole, merged)
    assert _cli("analyze", str(merged)).returncode == 0


def test_merge_refuses_what_would_not_be_the_whole_result(tmp_path, small_shards):
    """Exit 2 and a message saying what is wrong, nothing written: a missing block, parts of
    another job, overlapping parts, an incomplete part, an existing result (without
    --overwrite), blocks the job does not have. A part killed mid-run resumes (same block only)
    and merges into what the uninterrupted part gives; an empty block is a part holding none."""
    job = _sweep_job(tmp_path, small_shards)
    out = tmp_path / "m.h5"

    def part(name: str, *args: str, env: dict | None = None) -> Path:
        cp = _cli("run", str(job), "--out", str(tmp_path / name), "--quiet", *args, env=env)
        assert cp.returncode == 0, cp.stderr
        return tmp_path / name

    def refused(target: Path, *parts: Path) -> str:
        cp = _cli("merge", str(target), *map(str, parts))
        assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
        assert not partial_path(target).exists()
        return cp.stderr

    a, b = part("a.h5", "--configs", "0:2"), part("b.h5", "--configs", "2:4")
    err = refused(out, a)
    assert "the parts hold 2 of the job's 4 configurations; missing: 2-3" in err
    t0 = part("t.task0.h5", "--config-block", "0/2")
    err = refused(out, t0)
    assert "missing: 2-3 -- block 1/2 (no " in err and "t.task1.h5)" in err
    assert "sbatch --array=1 --export=ALL,MPI_DP_BLOCKS=2 slurm/sweep.sbatch" in err
    other = part("other.h5", "--configs", "2:4", "--set", "T=13")
    err = refused(out, a, other)
    assert "other.h5 and " in err and "are not parts of the same job (T = 12 vs 13)" in err
    err = refused(out, a, part("c.h5", "--configs", "1:4"))
    assert "configurations in more than one part: 1 in " in err
    assert not out.exists()
    # a part killed at record 2 of configuration 3 is refused until resumed with its block
    cut = tmp_path / "cut.h5"
    cp = _cli("run", str(job), "--out", str(cut), "--configs", "2:4", "--quiet",
              env={"MPI_DP_TEST_KILL_AT": "3:2"})
    assert cp.returncode != 0 and partial_path(cut).exists() and not cut.exists()
    err = refused(out, a, partial_path(cut))
    assert "cut.h5.partial is not complete (status running, configuration 4/4" in err
    cp = _cli("run", str(job), "--out", str(cut), "--configs", "0:2", "--resume")
    assert cp.returncode == 2 and "holds configurations 2:4; resume it with the same --configs" \
        in cp.stderr, cp.stderr
    cp = _cli("run", str(job), "--out", str(cut), "--configs", "2:4", "--resume")
    assert cp.returncode == 0 and "1 of 2 configuration(s) complete" in cp.stderr, cp.stderr
    empty = part("e.h5", "--configs", "4:")
    cp = _cli("merge", str(out), str(a), str(cut), str(empty))
    assert cp.returncode == 0, cp.stderr
    first = out.rename(tmp_path / "first.h5")
    err = refused(tmp_path / "m2.h5", a, b, empty, first)  # a whole result holds all 4
    assert "configurations in more than one part" in err
    assert _cli("merge", str(out), str(a), str(b)).returncode == 0
    before = out.read_bytes()
    err = refused(out, a, b)
    assert "m.h5 exists: merge never replaces a result; pass --overwrite" in err
    assert out.read_bytes() == before
    left = tmp_path / "m3.h5.partial"
    shutil.copyfile(a, left)
    cp = _cli("merge", str(tmp_path / "m3.h5"), str(a), str(b))
    assert cp.returncode == 2 and "m3.h5.partial is left by a job or merge that stopped before " \
        "completing" in cp.stderr, cp.stderr
    assert left.read_bytes() == Path(a).read_bytes()
    cp = _cli("merge", str(out), str(a), str(b), "--overwrite")
    assert cp.returncode == 0, cp.stderr
    assert_equal_results(first, out)  # the resumed part gives what the uninterrupted one does
    # blocks the job does not have, or a task file without a block
    cp = _cli("run", str(job), "--configs", "3:9", "--out", str(tmp_path / "x.h5"))
    assert cp.returncode == 2 and "the job has 4 configuration(s)" in cp.stderr
    cp = _cli("run", str(job), "--config-block", "3/3")
    assert cp.returncode == 2 and "give I/N with 0 <= I < N" in cp.stderr
    cp = _cli("run", str(job), "--task-file", "--out", str(tmp_path / "x.h5"))
    assert cp.returncode == 2 and "--task-file names the part of --config-block" in cp.stderr
    assert not (tmp_path / "x.h5").exists()


# -- Slurm: the array script under a real sbatch (skipped like tests/test_slurm.py) -------------
def slurm(test):
    """A test that needs the Slurm cluster, with test_slurm's marks (its skip, its worker)."""
    for mark in SLURM_MARKS:
        test = mark(test)
    return test


def _sbatch_array(tmp_path: Path, array: str, *args: str, env: dict | None = None) -> str:
    """sbatch --array=ARRAY slurm/sweep.sbatch ARGS on 2 tasks from tmp_path; the array job id."""
    full = dict(os.environ, MPI_DP_VENV=str(Path(sys.executable).parent.parent), **(env or {}))
    sub = subprocess.run(["sbatch", "--parsable", f"--array={array}", "--ntasks=2",
                          "--export=ALL", f"--chdir={tmp_path}", str(SWEEP), *args],
                         capture_output=True, text=True, env=full, timeout=60)
    assert sub.returncode == 0, sub.stderr
    return sub.stdout.strip().split(";")[0]


def _log(tmp_path: Path, jid: str, task: int) -> str:
    return (tmp_path / f"slurm-mpi_dp_sweep-{jid}_{task}.out").read_text()


@slurm
def test_sbatch_array_runs_one_block_per_task_and_merges_into_the_whole_run(tmp_path,
                                                                            small_shards):
    """sbatch --array=0-2 slurm/sweep.sbatch job.toml: three tasks write s.task0..2.h5; `mpi-dp
    merge s.h5` equals a whole run. A requeued task resumes its part."""
    job = _sweep_job(tmp_path, small_shards)
    whole = _whole(job, 2)
    jid = _sbatch_array(tmp_path, "0-2", str(job))
    _wait_gone(jid)
    for i in range(3):
        log = _log(tmp_path, jid, i)
        assert f"block {i}/3" in log and "mpi-dp: done" in log, log
    cp = _cli("merge", str(tmp_path / "s.h5"))
    assert cp.returncode == 0, cp.stderr
    assert_equal_results(whole, tmp_path / "s.h5")


@slurm
def test_a_requeued_array_task_resumes_its_part(tmp_path, small_shards):
    """`scontrol requeue` of task 1 of 2 while it runs its second configuration: the task
    restarts with --resume=auto, keeps the configuration it completed, and the merged file equals
    a whole run."""
    job = write_job(tmp_path / "rq.toml", small_shards, runs=2, T=1500, record_every=150,
                    sweep={"eps": [1.0, 2.0, 4.0, 8.0]})
    whole = _whole(job, 2)
    jid = _sbatch_array(tmp_path, "0-1", str(job))
    wait_for_progress(partial_path(tmp_path / "rq.task1.h5"), "progress_config", 3)
    rq = subprocess.run(["scontrol", "requeue", f"{jid}_1"], capture_output=True, text=True,
                        timeout=60)
    assert rq.returncode == 0, rq.stderr
    start_when_requeued(f"{jid}_1")
    _wait_gone(jid)
    log = _log(tmp_path, jid, 1)
    assert "resuming" in log and "1 of 2 configuration(s) complete" in log, log
    with h5py.File(tmp_path / "rq.task1.h5", "r") as f:
        assert f.attrs["resumed"] == 1
    cp = _cli("merge", str(tmp_path / "rq.h5"))
    assert cp.returncode == 0, cp.stderr
    assert_equal_results(whole, tmp_path / "rq.h5")
    with h5py.File(tmp_path / "rq.h5", "r") as f:
        assert [p["resumed"] for p in json.loads(f.attrs["merged_from"])] == [0, 1]


@slurm
def test_sweep_sbatch_checks_its_array(tmp_path, small_shards):
    """More tasks than configurations: an empty part, still merged. An array not starting at 0
    needs MPI_DP_BLOCKS (re-running one block of N); without it the task says so."""
    job = write_job(tmp_path / "two.toml", small_shards, runs=2, T=6, sweep={"eps": [1.0, 4.0]})
    jid = _sbatch_array(tmp_path, "0-2", str(job))
    bad = _sbatch_array(tmp_path, "1-2", str(job))
    _wait_gone(jid)
    _wait_gone(bad)
    assert "no configuration of the 2 (an empty block)" in _log(tmp_path, jid, 0)
    assert "--array must be 0-(N-1) for N blocks" in _log(tmp_path, bad, 1)
    cp = _cli("merge", str(tmp_path / "two.h5"))
    assert cp.returncode == 0 and "merged 3 part(s), 2 configuration(s)" in cp.stderr, cp.stderr
    (tmp_path / "two.task2.h5").unlink()
    again = _sbatch_array(tmp_path, "2", str(job), env={"MPI_DP_BLOCKS": "3"})
    _wait_gone(again)
    assert "block 2/3" in _log(tmp_path, again, 2)
    assert (tmp_path / "two.task2.h5").exists()
