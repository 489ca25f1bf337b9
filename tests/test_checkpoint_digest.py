"""Checkpoints prove themselves (mpi_dp.results.checkpoint `digest`): a checkpoint altered after
it was written (one model value, an owner's noise-stream position, an entry of another shape,
its digest removed) or written for another job, data, configuration or record count is not
used: `run --resume` says so in one line, restarts that configuration from its start, keeps the
complete ones and writes, bit for bit, what an uninterrupted run writes (no traceback, no silent
resume from altered values). An unaltered checkpoint still resumes from where it stood."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
from helpers import mpi_run, read_datasets, write_job

from mpi_dp.results.checkpoint import CheckpointDigestError, read_state, write_state
from mpi_dp.results.output import partial_path
from mpi_dp.results.recorder import ConfigRecorder, ResultFile

R = 3
NOTE = "the checkpoint does not match its digest"
WHY = ("(altered or damaged, or not of this job and data): it is not used; this configuration "
       "restarts from its start, the complete ones are kept")


# -- the format: any change refused before anything is built ------------------------------------
def _state() -> dict:
    rng = np.random.default_rng(5)
    return {"theta": rng.random((R, 5)), "k": 12, "flags": np.array([True, False, True]),
            "owners": {a: {"noise": (rng.integers(0, 2**63, R, dtype=np.uint64),), "x": 0.5 * a}
                       for a in range(6)}}  # 6 owners: stacked


def _written(path, context: str = "job A") -> None:
    with h5py.File(path, "w") as f:
        write_state(f.create_group("c"), _state(), context)


@pytest.mark.parametrize("change", ["value", "bit", "shape", "structure", "extra", "removed",
                                    "no_digest", "context"])
def test_any_change_to_a_checkpoint_is_refused_by_its_digest(tmp_path, change):
    path = tmp_path / "c.h5"
    _written(path)
    with h5py.File(path, "r") as f:
        assert read_state(f["c"], "job A")["k"] == 12  # unaltered: read back
    with h5py.File(path, "r+") as f:
        g = f["c"]
        names = sorted(k for k in g if k != "structure")
        ds = g[names[0]]
        if change == "value":
            a = ds[...]
            a.flat[0] = np.nextafter(a.flat[0], 2.0) if a.dtype.kind == "f" else a.flat[0] + 1
            ds[...] = a
        elif change == "bit":  # one bit of an unsigned column (a noise-stream position)
            u = next(g[k] for k in names if g[k].dtype == np.uint64)
            a = u[...]
            a.flat[-1] ^= np.uint64(1)
            u[...] = a
        elif change == "shape":  # the same bytes in another shape
            a = ds[...]
            del g[names[0]]
            g.create_dataset(names[0], data=a.reshape(-1))
        elif change == "structure":
            text = g["structure"][()].decode().replace('["i",12]', '["i",13]')
            del g["structure"]
            g.create_dataset("structure", data=text, dtype=h5py.string_dtype())
        elif change == "extra":
            g.create_dataset("d999", data=np.zeros(3))
        elif change == "removed":
            del g[names[-1]]
        elif change == "no_digest":
            del g.attrs["digest"]
    with h5py.File(path, "r") as f, pytest.raises(CheckpointDigestError, match="digest"):
        read_state(f["c"], "job B" if change == "context" else "job A")


# -- the recorder: a checkpoint bound to its job, data, configuration and records -----------------
def _recorder(f: h5py.File, context: str, n: int = 0) -> ConfigRecorder:
    rec = ConfigRecorder(f.require_group("configs/001"), runs=R, context=context)
    for k in range(n):
        rec.append(k, {"psi": np.full(R, float(k))})
    return rec


@pytest.mark.parametrize("other", ["job", "n_records", "same"])
def test_a_checkpoint_of_another_context_restarts_its_configuration(tmp_path, capsys, other):
    """Read back under another context (a checkpoint moved from another job's file) or with its
    n_records changed: one note naming the file and group, no state, the records dropped."""
    path = tmp_path / "r.h5"
    with h5py.File(path, "w") as f:
        rec = _recorder(f, "job A", 3)
        rec.save_state({"theta": np.ones((R, 2)), "k": 2})
        rec.append(3, {"psi": np.full(R, 3.0)})
        if other == "n_records":
            rec.group["checkpoint"].attrs["n_records"] = 2
    with h5py.File(path, "r+") as f:
        rec = ConfigRecorder(f["configs/001"], runs=R,
                             context="job B" if other == "job" else "job A")
        rec.resume_from_checkpoint()
        err = capsys.readouterr().err
        if other == "same":
            assert rec.saved_state()["k"] == 2 and rec.n_records == 3 and err == ""
            return
        assert rec.saved_state() is None and rec.n_records == 0 and len(rec.metrics) == 0
        assert "checkpoint" not in rec.group
    assert err.count(f"{path} [/configs/001]: {NOTE} {WHY}") == 1, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("data", ["same", "changed"])
def test_a_result_files_checkpoints_name_its_job_and_data(tmp_path, capsys, data):
    """ResultFile binds its configurations to the data's SHA-256: a resume on the same data
    continues the checkpoint; on other data (its digest given to reopen) the file is refused,
    naming both digests and what to do, and stays as it was (its checkpoint kept)."""
    path = tmp_path / "r.h5"
    rf = ResultFile(path, job_text='name = "x"\n', job_json='{"T": 3}', algorithm="sync_star",
                    variant="alg2", n_configs=2, sweep={"eps": [1, 2]},
                    provenance={"data_sha256": "a" * 64, "data_path": "s.h5"})
    rec = rf.config(1, R)
    rec.append(0, {"psi": np.zeros(R)})
    rec.save_state({"k": 0})
    rf.close("interrupted")
    if data == "changed":
        with pytest.raises(ValueError, match=r"the shard file s.h5 changed since .*r.h5 was "
                           r"started from it \(its SHA-256 was a{16}\.\.\., is now b{16}"
                           r"\.\.\.\): .*put that file back and resume, or start afresh"):
            ResultFile.reopen(path, '{"T": 3}', data_sha256="b" * 64)
        with h5py.File(path, "r") as f:  # untouched: still interrupted, its checkpoint kept
            assert f.attrs["status"] == "interrupted" and "checkpoint" in f["configs/001"]
        return
    rf = ResultFile.reopen(path, '{"T": 3}', data_sha256="a" * 64)
    rec = rf.config(1, R)
    assert rec.saved_state() == {"k": 0} and capsys.readouterr().err == ""
    rf.close("interrupted")


# -- a real resume --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def killed(tmp_path_factory, small_shards):
    """A sweep of 2 configurations (sync_star, 2 ranks): the uninterrupted result, and the
    partial file of the same job whose writer was SIGKILLed at record 6 of configuration 1 (a
    checkpoint at every record: the one after record 5, k = 12)."""
    d = tmp_path_factory.mktemp("digest")
    job = write_job(d / "c.toml", small_shards, T=30, runs=3, record_every=3,
                    sweep={"eps": [0.5, 2.0]})
    whole, cut = d / "whole.h5", d / "cut.h5"
    cp = mpi_run(2, ["run", str(job), "--out", str(whole), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    cp = mpi_run(2, ["run", str(job), "--out", str(cut), "--quiet"],
                 env={"MPI_DP_TEST_KILL_AT": "1:6", "MPI_DP_CHECKPOINT_S": "0"})
    assert cp.returncode != 0 and not cut.exists()
    return job, whole, partial_path(cut)


def _leaf(tree: list, *keys) -> list:
    """The node of a (non-stacked) dict tree at `keys` (str or int keys)."""
    node = tree
    for key in keys:
        assert node[0] == "d", node[:1]
        tag = "s" if isinstance(key, str) else "i"
        node = next(v for k, v in node[1] if k == [tag, key])
    return node


def _alter(g: h5py.Group, how: str) -> None:
    tree = json.loads(g["structure"][()])
    theta = _leaf(tree, "theta")[1]
    if how == "model":  # one model value, by one ulp
        a = g[theta][...]
        a[1, 2] = np.nextafter(a[1, 2], np.inf)
        g[theta][...] = a
    elif how == "rng":  # owner 0's noise stream one draw further
        name = _leaf(tree, "owners", 0, "noise")[1][0][1]
        a = g[name][...]
        assert a.dtype == np.uint64
        a[0] += np.uint64(1)
        g[name][...] = a
    elif how == "shape":  # the model entry replaced by one of another shape
        a = g[theta][...]
        del g[theta]
        g.create_dataset(theta, data=a[:, :-1])
    elif how == "no_digest":
        del g.attrs["digest"]


@pytest.mark.parametrize("how", ["model", "rng", "shape", "no_digest", "unaltered"])
def test_an_altered_checkpoint_restarts_its_configuration_bit_for_bit(tmp_path, killed, how):
    """Altered: one note (the file, the group, what is done), no traceback, exit status 0, no
    resume from the checkpoint, and every dataset of the uninterrupted run, byte for byte.
    Unaltered: it resumes from its checkpoint (k = 12) to the same bytes."""
    job, whole, partial = killed
    cut = tmp_path / "cut.h5"
    shutil.copy(partial, partial_path(cut))
    with h5py.File(partial_path(cut), "r+", locking=False) as f:
        g = f["configs/001/checkpoint"]
        assert g.attrs["n_records"] == 5 and "digest" in g.attrs
        _alter(g, how)
    cp = mpi_run(2, ["run", str(job), "--out", str(cut), "--resume"],
                 env={"MPI_DP_CHECKPOINT_S": "0"})
    assert cp.returncode == 0, cp.stderr
    assert "Traceback" not in cp.stderr and "bug in mpi_dp" not in cp.stderr, cp.stderr
    if how == "unaltered":
        assert "resumed from its checkpoint at k=12" in cp.stderr and NOTE not in cp.stderr
    else:
        assert "resumed from its checkpoint" not in cp.stderr, cp.stderr
        note = f"{partial_path(cut).name} [/configs/001]: {NOTE}"
        assert cp.stderr.count(note) == 1 and WHY in cp.stderr, cp.stderr
        if how == "no_digest":
            assert f"{NOTE}: it has none {WHY}" in cp.stderr
    a, b = read_datasets(whole), read_datasets(cut)
    assert sorted(a) == sorted(b) and not any("checkpoint" in k for k in b)
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k


def test_resume_on_changed_data_is_refused_and_the_file_kept(tmp_path):
    """The shard rewritten with other data between the run and --resume: the resume is refused
    (exit 2, one line naming the shard, both digests and what to do; the complete configuration
    was computed from the old data), the partial file is left as it was; with the old data put
    back the resume finishes it."""
    from mpi_dp.data.synth import write_synth

    data = tmp_path / "s.h5"
    write_synth(data, "regression", 3, [600, 500, 700], 5, 0.5, 11, public=2000)
    job = write_job(tmp_path / "c.toml", data, T=30, runs=3, record_every=3,
                    sweep={"eps": [0.5, 2.0]})
    cut = tmp_path / "cut.h5"
    cp = mpi_run(1, ["run", str(job), "--out", str(cut), "--quiet"],
                 env={"MPI_DP_TEST_KILL_AT": "1:6", "MPI_DP_CHECKPOINT_S": "0"})
    assert cp.returncode != 0 and partial_path(cut).exists()
    before = read_datasets(partial_path(cut))
    shutil.move(data, tmp_path / "old.h5")
    write_synth(data, "regression", 3, [600, 500, 700], 5, 0.5, 12, public=2000)
    cp = mpi_run(1, ["run", str(job), "--out", str(cut), "--resume"])
    assert cp.returncode == 2, cp.stderr
    errors = [ln for ln in cp.stderr.splitlines() if ln.startswith("mpi-dp: error")]
    assert len(errors) == 1 and "Traceback" not in cp.stderr, cp.stderr
    assert f"the shard file {data} changed since" in errors[0], errors
    assert "put that file back and resume, or start afresh" in errors[0], errors
    after = read_datasets(partial_path(cut))
    assert sorted(after) == sorted(before)
    assert all(np.asarray(after[k]).tobytes() == np.asarray(before[k]).tobytes() for k in before)
    shutil.move(tmp_path / "old.h5", data)
    cp = mpi_run(1, ["run", str(job), "--out", str(cut), "--resume", "--quiet"])
    assert cp.returncode == 0 and cut.exists(), cp.stderr
