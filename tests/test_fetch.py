"""mpi_dp.data.registry / fetch: pinned digests, mirror fetches, verification failures, offline errors."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import time
import urllib.error
import zipfile
from pathlib import Path

import pytest

from mpi_dp.data import fetch as F
from mpi_dp.data import registry as R
from mpi_dp.errors import DataError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not (SHARED / "SOURCES.md").exists(), reason="no shared/data folder")
SHARED_DATASETS = [n for n, d in R.DATASETS.items() if any(f.shared_path for f in d.files)]


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(F.CACHE_ENV, raising=False)
    monkeypatch.delenv(F.MIRROR_ENV, raising=False)


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """Records every URL fetch opens."""
    calls: list[str] = []
    real = F._urlopen

    def counting(url, timeout):
        calls.append(url)
        return real(url, timeout)

    monkeypatch.setattr(F, "_urlopen", counting)
    return calls


def _digest(path: Path, algo: str, gunzip: bool = False) -> str:
    data = path.read_bytes()
    return hashlib.new(algo, gzip.decompress(data) if gunzip else data).hexdigest()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _tiny_dataset(monkeypatch, *files: R.RemoteFile, name: str = "tiny") -> R.Dataset:
    ds = R.Dataset(name=name, files=tuple(files), description="test", licence="none", note="")
    monkeypatch.setitem(R.DATASETS, name, ds)
    return ds


# ----------------------------------------------------------------------------------------------
# registry


def test_registry_names_and_lookup():
    assert set(R.DATASETS) == {"lending", "creditcard", "sparcs", "mnist", "femnist", "reuters", "movielens"}
    assert R.get("mnist").name == "mnist"
    with pytest.raises(DataError) as e:
        R.get("covtype")
    assert "covtype" in str(e.value) and "movielens" in str(e.value) and "lending" in str(e.value)


def test_registry_entries_are_consistent():
    for ds in R.DATASETS.values():
        assert ds.licence and ds.note and ds.files
        assert len({f.name for f in ds.files}) == len(ds.files)
        for f in ds.files:
            assert "/" not in f.name
            assert f.url is not None or f.manual, f"{ds.name}/{f.name}: no url and no manual instructions"
            if f.url and "raw.githubusercontent.com" in f.url:  # pinned at an exact 40-hex commit
                commit = f.url.split("/")[5]
                assert len(commit) == 40 and int(commit, 16) >= 0
            for h in (f.sha256, *f.alt):
                assert h is None or (len(h) == 64 and int(h, 16) >= 0)
            assert f.content_md5 is None or (len(f.content_md5) == 32 and f.name.endswith(".gz"))
    assert R.get("movielens").files[0].url == "https://files.grouplens.org/datasets/movielens/ml-100k.zip"
    assert not R.get("movielens").files[0].pinned and R.get("movielens").files[0].shared_path is None
    assert "redistribution" in R.get("movielens").licence
    fem = R.get("femnist").files[0]
    assert fem.url is None and fem.sha256 and "--sf 0.05" in fem.manual and "--tf 0.9" in fem.manual
    for f in R.get("mnist").files:
        assert f.url == "https://ossci-datasets.s3.amazonaws.com/mnist/" + f.name
        assert f.sha256 is None and f.content_md5


@needs_shared
def test_pins_match_shared_copies():
    n_sha = n_md5 = 0
    for ds in R.DATASETS.values():
        for f in ds.files:
            if f.shared_path is None:
                continue
            path = SHARED / f.shared_path
            assert path.name == f.name
            if f.sha256:
                assert _digest(path, "sha256") == f.sha256, f"{ds.name}/{f.name}"
                assert path.stat().st_size == f.size
                n_sha += 1
            if f.content_md5:
                assert _digest(path, "md5", gunzip=True) == f.content_md5, f"{ds.name}/{f.name}"
                n_md5 += 1
    assert n_sha == 7 and n_md5 == 4
    # the content md5s are LeCun's (SOURCES.md), i.e. an official download verifies too
    assert R.get("mnist").file("train-images-idx3-ubyte.gz").content_md5 == "6bbc9ace898e44ae57da46a324031adb"


# ----------------------------------------------------------------------------------------------
# fetching from a mirror


@needs_shared
def test_fetch_all_shared_from_mirror(tmp_path, opened, capsys):
    mirror = F.mirror_from_shared(SHARED, tmp_path / "mirror")
    assert not (mirror / "movielens").exists()
    cache = tmp_path / "cache"
    base = f"file://{mirror}"
    for name in SHARED_DATASETS:
        paths = F.fetch(name, cache_dir=cache, mirror=base, progress=False)
        ds = R.get(name)
        assert [p.name for p in paths] == [f.name for f in ds.files]
        for p, f in zip(paths, ds.files, strict=True):
            assert p == cache / name / f.name and not p.is_symlink()
            assert p.read_bytes() == (SHARED / f.shared_path).read_bytes()
        manifest = json.loads((cache / name / "MANIFEST.json").read_text())["files"]
        assert {k: v["sha256"] for k, v in manifest.items()} == {p.name: _digest(p, "sha256") for p in paths}
    n_files = sum(len(R.get(n).files) for n in SHARED_DATASETS)
    assert len(opened) == n_files == 11
    assert all(u.startswith(base + "/") for u in opened)
    mtimes = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    # second call: verified in place, nothing opened, nothing rewritten
    for name in SHARED_DATASETS:
        F.fetch(name, cache_dir=cache, mirror=base, progress=False)
    assert len(opened) == n_files
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()} == mtimes
    assert all(not p.name.endswith(".part") for p in cache.rglob("*"))
    # force downloads again
    F.fetch("creditcard", cache_dir=cache, mirror=str(mirror), force=True, progress=False)
    assert len(opened) == n_files + 1


@needs_shared
def test_mirror_from_env_and_plain_folder(tmp_path, monkeypatch, opened):
    mirror = F.mirror_from_shared(SHARED, tmp_path / "m", names=["reuters"], copy=True)
    assert sorted(p.name for p in (mirror / "reuters").iterdir()) == ["reuters.trn.bz2", "reuters.tst.bz2"]
    assert not (mirror / "reuters" / "reuters.trn.bz2").is_symlink()
    monkeypatch.setenv(F.MIRROR_ENV, str(mirror))  # a plain folder path
    monkeypatch.setenv(F.CACHE_ENV, str(tmp_path / "envcache"))
    assert F.default_cache_dir() == tmp_path / "envcache"
    paths = F.fetch("reuters", progress=False)
    assert paths[0] == tmp_path / "envcache" / "reuters" / "reuters.trn.bz2" and paths[0].exists()
    base = mirror.resolve().as_uri()
    assert opened == [f"{base}/reuters/{n}" for n in ("reuters.trn.bz2", "reuters.tst.bz2")]


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert F.default_cache_dir() == tmp_path / ".cache" / "mpi_dp" / "data"


@needs_shared
def test_mnist_content_md5_accepts_regzipped_and_rejects_changed_content(tmp_path, monkeypatch):
    real = R.get("mnist").file("t10k-labels-idx1-ubyte.gz")
    _tiny_dataset(monkeypatch, real, name="labels")
    raw = gzip.decompress((SHARED / real.shared_path).read_bytes())
    # an "official" .gz: same content, different gzip bytes (header mtime, level, two members)
    regz = gzip.compress(raw[:3000], compresslevel=1, mtime=12345) + gzip.compress(raw[3000:], mtime=7)
    assert regz != (SHARED / real.shared_path).read_bytes()
    (tmp_path / "m" / "labels").mkdir(parents=True)
    (tmp_path / "m" / "labels" / real.name).write_bytes(regz)
    cache = tmp_path / "cache"
    [p] = F.fetch("labels", cache_dir=cache, mirror=str(tmp_path / "m"), progress=False)
    assert p.read_bytes() == regz
    # one label changed: content md5 differs -> rejected, nothing left behind
    bad = bytearray(raw)
    bad[100] = (bad[100] + 1) % 10
    (tmp_path / "m" / "labels" / real.name).write_bytes(gzip.compress(bytes(bad)))
    with pytest.raises(DataError) as e:
        F.fetch("labels", cache_dir=cache, mirror=str(tmp_path / "m"), force=True, progress=False)
    msg = str(e.value)
    assert real.content_md5 in msg and hashlib.md5(bytes(bad)).hexdigest() in msg and real.name in msg
    assert p.read_bytes() == regz  # the verified copy is untouched by the failed forced download
    assert _leftovers(cache / "labels") == ["MANIFEST.json", real.name]
    # a truncated gzip is rejected too
    (tmp_path / "m" / "labels" / real.name).write_bytes(regz[: len(regz) // 2])
    with pytest.raises(DataError, match="truncated gzip"):
        F.fetch("labels", cache_dir=tmp_path / "c2", mirror=str(tmp_path / "m"), progress=False)
    assert _leftovers(tmp_path / "c2" / "labels") == []


@needs_shared
def test_checksum_mismatch_one_byte(tmp_path):
    mirror = F.mirror_from_shared(SHARED, tmp_path / "m", names=["creditcard"], copy=True)
    target = mirror / "creditcard" / "creditcard_first3065rows.csv"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(DataError) as e:
        F.fetch("creditcard", cache_dir=cache, mirror=mirror.as_uri(), progress=False)
    msg = str(e.value)
    rf = R.get("creditcard").files[0]
    assert rf.name in msg and target.as_uri() in msg
    assert rf.sha256 in msg and hashlib.sha256(bytes(data)).hexdigest() in msg
    assert _leftovers(cache / "creditcard") == []


@needs_shared
def test_corrupt_cached_file_is_replaced(tmp_path, opened):
    mirror = F.mirror_from_shared(SHARED, tmp_path / "m", names=["reuters"])
    cache = tmp_path / "cache"
    F.fetch("reuters", cache_dir=cache, mirror=str(mirror), progress=False)
    tst = cache / "reuters" / "reuters.tst.bz2"
    tst.write_bytes(b"garbage")
    F.fetch("reuters", cache_dir=cache, mirror=str(mirror), progress=False)
    assert tst.read_bytes() == (SHARED / "reuters21578_lasvm_tick/reuters.tst.bz2").read_bytes()
    assert len(opened) == 3  # 2 first time, then only the corrupted one


# ----------------------------------------------------------------------------------------------
# failures without a source


def test_offline_closed_port_fails_fast(tmp_path, monkeypatch):
    rf = R.RemoteFile(name="x.bin", url="http://127.0.0.1:9/x.bin", sha256="0" * 64)
    _tiny_dataset(monkeypatch, rf)
    start = time.perf_counter()
    with pytest.raises(DataError) as e:
        F.fetch("tiny", cache_dir=tmp_path, timeout=5, progress=False)
    assert time.perf_counter() - start < 5
    msg = str(e.value)
    assert "cannot download http://127.0.0.1:9/x.bin" in msg and "--mirror" in msg
    assert str(tmp_path / "tiny" / "x.bin") in msg
    assert _leftovers(tmp_path / "tiny") == []


def test_offline_urlerror(tmp_path, monkeypatch):
    def fail(url, timeout):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(F, "_urlopen", fail)
    with pytest.raises(DataError) as e:
        F.fetch("reuters", cache_dir=tmp_path, progress=False)
    msg = str(e.value)
    assert "name resolution" in msg and "--mirror" in msg and "reuters.trn.bz2" in msg
    assert R.get("reuters").files[0].url in msg
    assert _leftovers(tmp_path / "reuters") == []


def test_truncated_transfer_is_an_error(tmp_path, monkeypatch):
    class Short(io.BytesIO):
        headers = {"Content-Length": "100"}

    monkeypatch.setattr(F, "_urlopen", lambda url, timeout: Short(b"x" * 40))
    _tiny_dataset(monkeypatch, R.RemoteFile(name="u.bin", url="https://example.invalid/u.bin", sha256=None))
    with pytest.raises(DataError, match="40 of 100 bytes"):
        F.fetch("tiny", cache_dir=tmp_path, progress=False)
    assert _leftovers(tmp_path / "tiny") == []


def test_manual_file_without_mirror(tmp_path):
    with pytest.raises(DataError) as e:
        F.fetch("femnist", cache_dir=tmp_path, progress=False)
    msg = str(e.value)
    assert "preprocess.sh -s niid --sf 0.05 -k 0 -t sample --tf 0.9" in msg
    assert str(tmp_path / "femnist" / "femnist_leaf_sf0.05_partial.tar.xz") in msg and "--mirror" in msg


@needs_shared
def test_manual_file_placed_by_hand_is_accepted(tmp_path, monkeypatch):
    monkeypatch.setattr(F, "_urlopen", lambda url, timeout: pytest.fail("must not download"))
    dest = tmp_path / "femnist" / "femnist_leaf_sf0.05_partial.tar.xz"
    dest.parent.mkdir()
    dest.write_bytes((SHARED / "femnist_leaf_sf0.05_partial.tar.xz").read_bytes())
    [f] = F.fetch_files("femnist", cache_dir=tmp_path, progress=False)
    assert f.path == dest and not f.downloaded and f.sha256 == R.get("femnist").files[0].sha256
    dest.write_bytes(b"not it")  # a wrong placed file is reported, not silently accepted
    with pytest.raises(DataError, match="fails its check"):
        F.fetch("femnist", cache_dir=tmp_path, progress=False)


# ----------------------------------------------------------------------------------------------
# unpinned (trust on first use)


def _tiny_zip(path: Path, text: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("ml-100k/u.data", text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def test_unpinned_movielens_trust_on_first_use(tmp_path, capsys, opened):
    mirror, cache = tmp_path / "m", tmp_path / "cache"
    data = _tiny_zip(mirror / "movielens" / "ml-100k.zip", "1\t2\t5\t881250949\n")
    sha = hashlib.sha256(data).hexdigest()
    [p] = F.fetch("movielens", cache_dir=cache, mirror=mirror.as_uri())
    assert p.read_bytes() == data
    err = capsys.readouterr().err
    assert sha in err and "not pinned" in err and "trust on first use" in err
    rec = json.loads((cache / "movielens" / "MANIFEST.json").read_text())["files"]["ml-100k.zip"]
    assert rec["sha256"] == sha and rec["size"] == len(data) and rec["file"] == "ml-100k.zip"
    assert rec["url"] == f"{mirror.as_uri()}/movielens/ml-100k.zip" and rec["fetched_at"]
    # the recorded digest now acts as a pin: a changed upstream file is refused ...
    (cache / "movielens" / "ml-100k.zip").unlink()
    changed = _tiny_zip(mirror / "movielens" / "ml-100k.zip", "1\t2\t4\t881250949\n")
    with pytest.raises(DataError) as e:
        F.fetch("movielens", cache_dir=cache, mirror=str(mirror), progress=False)
    assert sha in str(e.value) and hashlib.sha256(changed).hexdigest() in str(e.value)
    assert "--force" in str(e.value)
    assert _leftovers(cache / "movielens") == ["MANIFEST.json"]
    # ... unless --force accepts it and records the new digest
    F.fetch("movielens", cache_dir=cache, mirror=str(mirror), force=True, progress=False)
    rec = json.loads((cache / "movielens" / "MANIFEST.json").read_text())["files"]["ml-100k.zip"]
    assert rec["sha256"] == hashlib.sha256(changed).hexdigest()
    assert len(opened) == 3


# ----------------------------------------------------------------------------------------------
# CLI


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mpi-dp data fetch")
    F.add_fetch_arguments(ap)
    return ap


def test_cli_list_prints_every_dataset(capsys):
    assert F.run_fetch_command(_parser().parse_args(["--list"])) == 0
    out = capsys.readouterr().out
    for ds in R.DATASETS.values():
        assert f"{ds.name}:" in out
        for f in ds.files:
            assert f.name in out
            assert (f.url or "manual") in out
    assert "NOT pinned" in out and R.get("reuters").files[0].sha256 in out


def test_cli_help_teaches_mirror():
    text = _parser().format_help()
    assert "--mirror" in text and "examples:" in text and "offline" in text and "mirror_from_shared" in text


@needs_shared
def test_cli_fetch_prints_paths_sizes_hashes(tmp_path, capsys):
    mirror = F.mirror_from_shared(SHARED, tmp_path / "m", names=["sparcs"])
    argv = ["sparcs", "--cache", str(tmp_path / "c"), "--mirror", str(mirror), "--quiet"]
    args = _parser().parse_args(argv)
    assert F.run_fetch_command(args) == 0
    cap = capsys.readouterr()
    rf = R.get("sparcs").files[0]
    assert str(tmp_path / "c" / "sparcs" / rf.name) in cap.out and rf.sha256 in cap.out
    assert f"{rf.size:,} B" in cap.out and "downloaded" in cap.out and cap.err == ""
    assert F.run_fetch_command(args) == 0
    assert "already cached" in capsys.readouterr().out


def test_cli_all_continues_past_failures(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(F, "_urlopen", lambda url, timeout: (_ for _ in ()).throw(OSError("offline")))
    args = _parser().parse_args(["all", "--cache", str(tmp_path), "--quiet"])
    assert F.run_fetch_command(args) == 1
    err = capsys.readouterr().err
    for name in R.DATASETS:
        assert f"{name}: FAILED" in err
    assert f"{len(R.DATASETS)} of {len(R.DATASETS)} datasets failed" in err
    with pytest.raises(DataError, match="unknown dataset"):
        F.run_fetch_command(_parser().parse_args(["nope"]))
    with pytest.raises(DataError, match="--list"):
        F.run_fetch_command(_parser().parse_args([]))
