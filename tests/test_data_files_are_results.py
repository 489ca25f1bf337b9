"""Data files are results too: `data prepare` / `data synth` never replace a shard file silently
(--overwrite), refuse numeric options out of range before reading or writing anything, write the
file once under mpiexec; a shard records its content digest; `analyze` says when the shard a
result was computed from changed, and how to clean up after a killed job."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from helpers import mpi_run, wait_for_progress, write_job

from mpi_dp.cli import main
from mpi_dp.data.shard_reader import ShardFile
from mpi_dp.data.shard_writer import rewrite_shards, write_shards
from mpi_dp.results.output import lock_path, partial_path, reserve_path

CSV = "a,b,y\n" + "".join(f"{i % 7},{(3 * i) % 11},{i % 5}\n" for i in range(120))
SYNTH = ["data", "synth", "--agents", "2", "--records", "40", "--dim", "3", "--public", "50"]


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def stored_digest(path: Path) -> str | None:
    from mpi_dp.data.shard_digest import stored_digest  # new with the digest: imported late, so
    return stored_digest(path)  # that the other tests run (and fail) on the code before it


def file_digest(path: Path) -> str:
    from mpi_dp.data.shard_digest import file_digest
    return file_digest(path)


def _errors(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("mpi-dp: error")]


# --- row 1: an existing --out is refused without --overwrite -----------------------------------


def test_synth_never_replaces_a_shard_file_without_overwrite(tmp_path, capsys):
    out = tmp_path / "s.h5"
    assert _cli(capsys, *SYNTH, "--seed", "1", "--out", str(out))[0] == 0
    before = out.read_bytes()
    rc, stdout, err = _cli(capsys, *SYNTH, "--seed", "2", "--out", str(out))
    assert rc == 2 and stdout == "" and len(_errors(err)) == 1, err
    assert (f"{out} exists: `mpi-dp data synth` never replaces a result" in err
            and "pass --overwrite to replace it" in err), err
    assert out.read_bytes() == before
    assert _cli(capsys, *SYNTH, "--seed", "2", "--out", str(out), "--overwrite")[0] == 0
    assert out.read_bytes() != before
    with h5py.File(out, "r") as f:
        assert "seed=2" in f.attrs["source"]


def test_prepare_refuses_an_existing_out_before_reading_anything(tmp_path, capsys):
    src, out = tmp_path / "d.csv", tmp_path / "p.h5"
    src.write_text(CSV)
    args = ["data", "prepare", "csv", str(src), "--target", "y", "--quiet", "--out", str(out)]
    assert _cli(capsys, *args)[0] == 0
    before = out.read_bytes()
    src.unlink()  # the refusal comes first: it does not even look for the source
    rc, _, err = _cli(capsys, *args)
    assert rc == 2 and len(_errors(err)) == 1, err
    assert f"{out} exists: `mpi-dp data prepare` never replaces a result" in err, err
    assert out.read_bytes() == before
    src.write_text(CSV.replace("\n0,", "\n6,", 1))
    assert _cli(capsys, *args, "--overwrite")[0] == 0
    assert out.read_bytes() != before


def test_the_same_command_with_overwrite_writes_the_same_bytes(tmp_path, capsys):
    """--overwrite is not recorded in the shard: regenerating a file gives the same data_sha256."""
    src, out = tmp_path / "d.csv", tmp_path / "p.h5"
    src.write_text(CSV)
    args = ["data", "prepare", "csv", str(src), "--target", "y", "--quiet", "--out", str(out)]
    assert _cli(capsys, *args)[0] == 0
    before = out.read_bytes()
    assert _cli(capsys, *args, "--overwrite")[0] == 0
    assert out.read_bytes() == before


@pytest.mark.parametrize("command", ["synth", "prepare"])
def test_help_documents_overwrite(capsys, command):
    with pytest.raises(SystemExit):
        main(["data", command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--overwrite replace an existing --out" in text


# --- row 1: the shard's content digest ---------------------------------------------------------


def test_a_shard_records_the_digest_of_its_content(tmp_path, capsys):
    src, out = tmp_path / "d.csv", tmp_path / "p.h5"
    src.write_text("race,a,y\n" + "".join(f"{['x', 'yy', 'z'][i % 3]},{i % 7},{i % 2}\n"
                                          for i in range(90)))
    assert _cli(capsys, "data", "prepare", "csv", str(src), "--target", "y", "--partition",
                "key", "--key", "race", "--test-frac", "0.2", "--public", "10", "--quiet",
                "--out", str(out))[0] == 0
    digest = stored_digest(out)
    assert digest is not None and len(digest) == 64 and digest == file_digest(out)
    # the same records in the other layout: the same digest (not a digest of the bytes)
    groups = rewrite_shards(out, tmp_path / "g.h5", layout="groups")
    assert groups.read_bytes() != out.read_bytes()
    assert stored_digest(groups) == digest == file_digest(groups)
    # other data, another digest: one record changed
    with ShardFile(out) as f:
        agents = f.read_agents(range(f.n_agents))
    X, y = agents[0]
    X = X.copy()
    X[0, 0] += 1.0
    other = write_shards(tmp_path / "o.h5", [(X, y), *agents[1:]])
    same = write_shards(tmp_path / "same.h5", agents)
    assert stored_digest(other) != stored_digest(same)
    assert stored_digest(other) == file_digest(other)


def test_a_shard_without_a_digest_still_opens(tmp_path):
    """Files written before the digest existed: no content_sha256, read as before."""
    path = write_shards(tmp_path / "old.h5", [([[1.0, 2.0]], [0.5]), ([[3.0, 4.0]], [1.5])])
    with h5py.File(path, "r+") as f:
        del f.attrs["content_sha256"]
    assert stored_digest(path) is None
    with ShardFile(path) as f:
        assert f.n_agents == 2 and f.read_agent(1)[1].tolist() == [1.5]
    assert len(file_digest(path)) == 64


# --- row 1: analyze says when the shard changed ------------------------------------------------


def test_analyze_says_when_the_shard_of_a_result_changed(tmp_path, capsys, monkeypatch):
    from mpi_dp.runner import run_job

    monkeypatch.chdir(tmp_path)
    assert _cli(capsys, *SYNTH, "--seed", "1", "--out", "s.h5")[0] == 0
    job = write_job(tmp_path / "j.toml", Path("s.h5"), T=3, runs=2)
    result = run_job(job, progress=False)
    rc, _, err = _cli(capsys, "analyze", str(result))
    assert rc == 0 and "shard file" not in err, err
    assert _cli(capsys, *SYNTH, "--seed", "2", "--out", "s.h5", "--overwrite")[0] == 0
    rc, _, err = _cli(capsys, "analyze", str(result))
    lines = [ln for ln in err.splitlines() if "s.h5" in ln]
    assert rc == 0 and len(lines) == 1, err
    assert "the shard file s.h5 changed after this result was computed from it" in lines[0]
    with h5py.File(result, "r") as f:
        assert f["provenance"].attrs["data_sha256"][:12] in lines[0]
    (tmp_path / "s.h5").unlink()
    rc, _, err = _cli(capsys, "analyze", str(result))
    assert rc == 0 and "the shard file s.h5 this result was computed from is not found" in err


# --- row 2: numeric options in range, refused before anything is read or written ---------------

#: (arguments after `data prepare csv missing.csv --target y --out x.h5` or `data synth --out
#: x.h5`, the message): the source file does not exist, so a range check that came after
#: reading it would say so instead
RANGE_CASES = [
    ("prepare", ["--test-frac", "-0.2"], "--test-frac -0.2: must be a number in [0, 1)"),
    ("prepare", ["--test-frac", "1"], "--test-frac 1.0: must be a number in [0, 1)"),
    ("prepare", ["--pca", "0"], "--pca 0: must be an integer >= 1"),
    ("prepare", ["--partition", "key", "--key", "a", "--min-records", "-3"],
     "--min-records -3: must be an integer >= 1"),
    ("prepare", ["--seed", "-1"], "--seed -1: must be an integer >= 0"),
    ("prepare", ["--agents", "0"], "--agents 0: must be an integer >= 1"),
    ("prepare", ["--alpha", "nan", "--partition", "dirichlet"],
     "--alpha nan: must be a finite number > 0"),
    ("prepare", ["--max-missing-frac", "1.5"], "--max-missing-frac 1.5: must be a number in [0, 1]"),
    ("prepare", ["--partition", "blocks", "--sizes", "10", "-3"],
     "--sizes 10 -3: -3 is out of range: each must be an integer >= 1"),
    ("synth", ["--seed", "-1"], "--seed -1: must be an integer >= 0"),
    ("synth", ["--noise", "inf"], "--noise inf: must be a finite number >= 0"),
    ("synth", ["--records", "5,0"], "--records 5 0: 0 is out of range: each must be an integer"),
    ("synth", ["--classes", "1", "--task", "multiclass"], "--classes 1: must be an integer >= 2"),
    ("synth", ["--task", "p2p", "--gamma", "0"], "--gamma 0.0: must be a finite number > 0"),
    ("synth", ["--task", "p2p", "--test-records", "-1"],
     "--test-records -1: must be an integer >= 1"),
]


@pytest.mark.parametrize("case", RANGE_CASES, ids=[" ".join(c[1]) for c in RANGE_CASES])
def test_a_numeric_option_out_of_range_is_refused_first(tmp_path, capsys, case):
    command, args, message = case
    out = tmp_path / "x.h5"
    head = (["data", "prepare", "csv", str(tmp_path / "missing.csv"), "--target", "y"]
            if command == "prepare" else ["data", "synth"])
    rc, stdout, err = _cli(capsys, *head, *args, "--out", str(out))
    assert rc == 2 and "Traceback" not in err and stdout == "", err
    errors = _errors(err)
    assert len(errors) == 1 and message in errors[0], err
    assert not out.exists()


def test_a_recipe_option_out_of_range_is_refused_before_its_files_are_looked_for(capsys):
    rc, _, err = _cli(capsys, "data", "prepare", "lending", "--source", "/nonexistent",
                      "--opt", "pca=-1")
    assert rc == 2 and _errors(err) == ["mpi-dp: error: --opt pca=-1: must be an integer >= 1"]


# --- row 3: under mpiexec, rank 0 alone writes and prints --------------------------------------


def test_under_mpiexec_one_rank_writes_the_shard_and_prints_one_summary(tmp_path):
    src, out = tmp_path / "d.csv", tmp_path / "p.h5"
    src.write_text(CSV)
    cp = mpi_run(2, ["data", "prepare", "csv", str(src), "--target", "y", "--out", str(out)],
                 cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.count(f"wrote {out}") == 1 and cp.stdout.count("rows read") == 1, cp.stdout
    assert "error" not in cp.stderr, cp.stderr
    with ShardFile(out) as f:
        assert f.n_agents == 4 and int(f.sizes().sum()) == 120
    assert stored_digest(out) == file_digest(out)
    cp = mpi_run(2, ["data", "synth", "--agents", "2", "--records", "30", "--out",
                     str(tmp_path / "s.h5")], cwd=tmp_path)
    assert cp.returncode == 0 and cp.stdout.count("wrote ") == 1, (cp.stdout, cp.stderr)


# --- row 4: analyze says how to clean up after a killed job ------------------------------------


def test_analyze_of_a_killed_job_says_which_files_to_remove(tmp_path, small_shards):
    job = write_job(tmp_path / "k.toml", small_shards, T=100000, runs=2, record_every=20)
    final = tmp_path / "k.h5"
    proc = subprocess.Popen([sys.executable, "-m", "mpi_dp", "run", str(job), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_progress(partial_path(final), "progress_record", 2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert lock_path(final).exists() and reserve_path(final).exists()
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "analyze", str(final)],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0 and "is gone" in cp.stderr, cp.stderr
    lines = [ln for ln in cp.stderr.splitlines() if "rm " in ln]
    assert len(lines) == 1 and "k.h5.lock" in lines[0] and "k.h5.reserve" in lines[0], cp.stderr
    command = shlex.split(lines[0].split("  rm ", 1)[1])
    assert sorted(command) == sorted([str(lock_path(final)), str(reserve_path(final))])
    subprocess.run(["rm", *command], check=True)
    assert not lock_path(final).exists() and partial_path(final).exists()
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "analyze", str(final)],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0 and "rm " not in cp.stderr, cp.stderr


def test_analyze_of_a_job_killed_before_its_file_says_which_files_to_remove(tmp_path):
    """Killed during start-up: no PATH.partial yet, only the lock and reserve files."""
    import json

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    final = tmp_path / "early.h5"
    lock_path(final).write_text(json.dumps({"host": socket.gethostname(), "pid": gone.pid,
                                            "since": "then"}))
    reserve_path(final).write_bytes(b"\0" * 16)
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "analyze", str(final)],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 2 and len(_errors(cp.stderr)) == 1, cp.stderr
    assert f"result file not found: {final}" in cp.stderr and "  rm " in cp.stderr, cp.stderr
    command = shlex.split(cp.stderr.split("  rm ", 1)[1])
    assert sorted(command) == sorted([str(lock_path(final)), str(reserve_path(final))])
