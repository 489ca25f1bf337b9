"""Download a dataset's original files into a local cache, verified by their pinned digests.

Files land in CACHE/DATASET/FILE. A download streams into a temporary file in the same folder while
it is hashed, and is moved into place with os.replace only once verified, so an interrupted or
corrupt download never leaves a file that looks valid. A mirror (a local folder or a file:// or
https:// base URL laid out as MIRROR/DATASET/FILE) replaces the upstream URLs, for offline
machines and for files that need a login upstream. Files with no pinned digest are trusted on first
use: their SHA-256 is recorded in CACHE/DATASET/MANIFEST.json and checked on later fetches.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import http.client
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from mpi_dp import progress as prog
from mpi_dp.data import registry
from mpi_dp.data.registry import Dataset, RemoteFile
from mpi_dp.errors import DataError

CACHE_ENV = "MPI_DP_DATA_CACHE"
MIRROR_ENV = "MPI_DP_DATA_MIRROR"
MANIFEST = "MANIFEST.json"
CHUNK = 1 << 20
DOWNLOAD_EVERY_S = 2.0
USER_AGENT = "mpi-dp-data-fetch/1"


def default_cache_dir() -> Path:
    """$MPI_DP_DATA_CACHE if set, else ~/.cache/mpi_dp/data."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mpi_dp" / "data"


@dataclasses.dataclass(frozen=True)
class FetchedFile:
    """Outcome for one file: where it is, its size and SHA-256, and whether it was downloaded now."""

    dataset: str
    path: Path
    size: int
    sha256: str
    check: str
    url: str | None
    downloaded: bool


# ----------------------------------------------------------------------------------------------
# hashing


class _Digests:
    """SHA-256 of the bytes and, when asked, md5 of their gunzipped content, fed chunk by chunk."""

    def __init__(self, content_md5: bool) -> None:
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._md5 = hashlib.md5() if content_md5 else None
        self._gz = zlib.decompressobj(16 + zlib.MAX_WBITS) if content_md5 else None
        self._gz_error: str | None = None

    def update(self, chunk: bytes) -> None:
        self.sha256.update(chunk)
        self.size += len(chunk)
        if self._gz is None or self._gz_error:
            return
        try:
            while chunk:
                assert self._md5 is not None
                self._md5.update(self._gz.decompress(chunk))
                chunk = self._gz.unused_data if self._gz.eof else b""
                if chunk:  # a further gzip member (multi-member .gz files are valid gzip)
                    self._gz = zlib.decompressobj(16 + zlib.MAX_WBITS)
        except zlib.error as e:
            self._gz_error = f"not valid gzip ({e})"

    def content_md5(self) -> str:
        """md5 of the decompressed content, or a '<...>' description of why there is none."""
        if self._md5 is None:
            return "<not computed>"
        if self._gz_error:
            return f"<{self._gz_error}>"
        assert self._gz is not None
        if not self._gz.eof:
            return "<truncated gzip stream>"
        return self._md5.hexdigest()


def _hash_file(path: Path, content_md5: bool) -> _Digests:
    d = _Digests(content_md5)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            d.update(chunk)
    return d


def _mismatch(rf: RemoteFile, d: _Digests, expected_sha: str | None) -> str | None:
    """Why the digests `d` fail the checks of `rf` (with `expected_sha` overriding the pin), or None."""
    accepted = tuple(x for x in (expected_sha, *rf.alt) if x)
    actual = d.sha256.hexdigest()
    if accepted and actual not in accepted:
        return f"expected sha256 {' or '.join(accepted)}, got sha256 {actual}"
    if rf.content_md5:
        got = d.content_md5()
        if got != rf.content_md5:
            return f"expected md5 of the decompressed content {rf.content_md5}, got {got}"
    return None


# ----------------------------------------------------------------------------------------------
# manifest


def _read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        return dict(data.get("files", {}))
    except (OSError, ValueError, AttributeError) as e:
        raise DataError(f"{path}: unreadable manifest ({e}); delete it to start afresh") from None


def _write_manifest(folder: Path, dataset: str, files: dict[str, Any]) -> None:
    """Write MANIFEST.json atomically (temporary file + os.replace)."""
    text = json.dumps({"dataset": dataset, "files": files}, indent=2, sort_keys=True) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", suffix=".part", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, folder / MANIFEST)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------------------------
# downloading


def mirror_url(mirror: str) -> str:
    """Base URL of a mirror given as a URL (file://, http(s)://) or as a local folder path."""
    if "://" in mirror:
        return mirror.rstrip("/")
    return Path(mirror).expanduser().resolve().as_uri()


def _source_url(dataset: str, rf: RemoteFile, mirror: str | None) -> str | None:
    if mirror:
        q = urllib.parse.quote
        return f"{mirror_url(mirror)}/{q(dataset)}/{q(rf.name)}"
    return rf.url


def _urlopen(url: str, timeout: float) -> BinaryIO:
    """Open `url` for reading (module-level so tests can count or fake calls)."""
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 (URLs come from the table)


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):
        return str(e.reason)
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    yield from iter(lambda: stream.read(CHUNK), b"")


def _human(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _download_progress(label: str, total: int | None, enabled: bool) -> Callable[..., None]:
    """`show(done, final=False)`: the project's progress reporter on a download, as
    '[dataset/file] x / y MiB, z MiB/s (t s)' every DOWNLOAD_EVERY_S seconds and at the end."""
    bar = prog.Progress(label, total or 0, enabled=enabled, every_s=DOWNLOAD_EVERY_S,
                        count=lambda k, t: _human(k) + (f" / {_human(t)}" if t else ""))

    def show(done: int, final: bool = False) -> None:
        bar.update(done, lambda: f"{done / 2**20 / max(time.perf_counter() - bar.t0, 1e-6):.1f} "
                   "MiB/s", force=final)
    return show


def _download(
    dataset: str, rf: RemoteFile, url: str, dest: Path, expected_sha: str | None, timeout: float,
    progress: bool,
) -> _Digests:
    """Stream `url` to a temporary file beside `dest`, verify, then move it into place."""
    hint = f"no network? Use --mirror DIR or place the file at {dest}"
    fd, tmp_name = tempfile.mkstemp(prefix=f".{rf.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        d = _Digests(bool(rf.content_md5))
        with os.fdopen(fd, "wb") as out:
            try:
                with _urlopen(url, timeout) as response:
                    length = response.headers.get("Content-Length") if hasattr(response, "headers") else None
                    total = int(length) if length and length.isdigit() else None
                    show = _download_progress(f"{dataset}/{rf.name}", total or rf.size, progress)
                    for chunk in _chunks(response):
                        out.write(chunk)
                        d.update(chunk)
                        show(d.size)
                    show(d.size, final=True)
            except (OSError, http.client.HTTPException, ValueError) as e:
                raise DataError(f"cannot download {url} ({_reason(e)}): {hint}") from None
        if total is not None and d.size != total:
            raise DataError(
                f"cannot download {url} (connection closed after {d.size} of {total} bytes): {hint}"
            )
        why = _mismatch(rf, d, expected_sha)
        if why:
            raise DataError(
                f"checksum mismatch for {dataset}/{rf.name} downloaded from {url}: {why}. "
                "The download was removed; the source may be corrupt or changed upstream"
                + (" (if the change is expected, use --force to accept it)" if not rf.pinned else "")
            )
        os.replace(tmp, dest)
        return d
    finally:
        tmp.unlink(missing_ok=True)


def _fetch_file(
    ds: Dataset, rf: RemoteFile, folder: Path, manifest: dict[str, Any], *, mirror: str | None,
    force: bool, timeout: float, progress: bool,
) -> FetchedFile:
    dest = folder / rf.name
    record = manifest.get(rf.name) or {}
    recorded = None if (rf.pinned or force) else record.get("sha256")
    expected = rf.sha256 or recorded
    check = rf.check if rf.pinned else ("recorded sha256 (trust on first use)" if recorded else "unpinned")
    stale = ""
    if dest.exists() and not force:
        d = _hash_file(dest, bool(rf.content_md5))
        why = _mismatch(rf, d, expected)
        if why is None:
            sha = d.sha256.hexdigest()
            if rf.name not in manifest:
                manifest[rf.name] = {
                    "file": rf.name, "size": d.size, "sha256": sha, "url": None, "check": check,
                    "fetched_at": None, "found_in_cache": True,
                }
            return FetchedFile(ds.name, dest, d.size, sha, check, None, False)
        stale = f"{dest} exists but fails its check ({why}); "
        if progress:
            print(f"  {stale}downloading it again", file=sys.stderr)
    url = _source_url(ds.name, rf, mirror)
    if url is None:
        raise DataError(
            f"{stale}{ds.name}/{rf.name} cannot be downloaded automatically. {rf.manual} "
            f"Place the file at {dest} or use --mirror DIR (laid out as DIR/{ds.name}/{rf.name})."
        )
    if progress:
        print(f"fetching {ds.name}/{rf.name} from {url}", file=sys.stderr)
    d = _download(ds.name, rf, url, dest, expected, timeout, progress)
    sha = d.sha256.hexdigest()
    if not expected and not rf.content_md5 and progress:
        print(
            f"  {ds.name}/{rf.name} is not pinned (trust on first use): sha256 {sha} recorded in "
            f"{folder / MANIFEST}", file=sys.stderr,
        )
    manifest[rf.name] = {
        "file": rf.name, "size": d.size, "sha256": sha, "url": url, "check": check, "fetched_at": _now(),
    }
    return FetchedFile(ds.name, dest, d.size, sha, check, url, True)


def fetch_files(
    name: str, *, cache_dir: str | os.PathLike[str] | None = None, mirror: str | None = None,
    force: bool = False, timeout: float = 60, progress: bool = True,
) -> list[FetchedFile]:
    """Like `fetch`, returning per-file details (size, SHA-256, source, downloaded or cached)."""
    ds = registry.get(name)
    mirror = mirror or os.environ.get(MIRROR_ENV) or None
    folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    folder = folder / ds.name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create cache folder {folder}: {e}") from None
    manifest = _read_manifest(folder)
    before = json.dumps(manifest, sort_keys=True)
    results: list[FetchedFile] = []
    try:
        for rf in ds.files:
            results.append(_fetch_file(ds, rf, folder, manifest, mirror=mirror, force=force,
                                       timeout=timeout, progress=progress))
    finally:
        if json.dumps(manifest, sort_keys=True) != before:
            _write_manifest(folder, ds.name, manifest)
    return results


def fetch(
    name: str, *, cache_dir: str | os.PathLike[str] | None = None, mirror: str | None = None,
    force: bool = False, timeout: float = 60, progress: bool = True,
) -> list[Path]:
    """Make sure every file of dataset `name` is in CACHE/NAME/, verified; return their paths.

    Files already present and verified are not downloaded again unless `force`. `mirror` (default:
    $MPI_DP_DATA_MIRROR) is a folder or base URL used instead of the upstream URLs, laid out as
    MIRROR/NAME/FILE. `timeout` bounds each network operation in seconds. Raises DataError on a
    checksum mismatch, an unreachable source, or a manual-only file with no mirror.
    """
    found = fetch_files(name, cache_dir=cache_dir, mirror=mirror, force=force, timeout=timeout,
                        progress=progress)
    return [f.path for f in found]


def mirror_from_shared(
    shared_data_dir: str | os.PathLike[str], mirror_dir: str | os.PathLike[str],
    names: Iterable[str] | None = None, *, copy: bool = False,
) -> Path:
    """Lay out MIRROR/NAME/FILE from the verified copies in shared/data; return the mirror folder.

    Only files with a `shared_path` are included (MovieLens is not: its licence forbids
    redistribution and the shared copy is a re-packed tar.xz, not the official zip). Files are
    symlinked, or copied when `copy`. Serve the result with `--mirror DIR` or `file://DIR`.
    """
    shared = Path(shared_data_dir)
    out = Path(mirror_dir)
    for dname in names if names is not None else registry.DATASETS:
        ds = registry.get(dname)
        for rf in ds.files:
            if rf.shared_path is None:
                continue
            src = shared / rf.shared_path
            if not src.is_file():
                raise DataError(f"{src}: missing from the shared data folder (for {ds.name}/{rf.name})")
            dst = out / ds.name / rf.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.is_symlink() or dst.exists():
                dst.unlink()
            if copy:
                shutil.copyfile(src, dst)
            else:
                dst.symlink_to(src.resolve())
    out.mkdir(parents=True, exist_ok=True)
    return out


# ----------------------------------------------------------------------------------------------
# CLI: mpi-dp data fetch

_EPILOG = """\
examples:
  mpi-dp data fetch --list                      # datasets, files, URLs, pinned or not, licences
  mpi-dp data fetch mnist                       # into ~/.cache/mpi_dp/data/mnist/
  mpi-dp data fetch all --cache /scratch/data   # every dataset that can be downloaded
  mpi-dp data fetch reuters --force             # download again even if cached and verified

offline (no network, e.g. on compute nodes): build a mirror once on a machine that has the files,
laid out as DIR/DATASET/FILE, and point --mirror (or $MPI_DP_DATA_MIRROR) at it:
  python -c "from mpi_dp.data.fetch import mirror_from_shared as m; m('shared/data', '/tmp/mirror')"
  mpi-dp data fetch all --mirror /tmp/mirror          # or --mirror file:///tmp/mirror
  mpi-dp data fetch mnist --mirror https://host/datasets

Every file is checked against the SHA-256 in the table (MNIST: md5 of the decompressed content, so
the official files and re-gzipped copies both verify). A file with no pinned digest (MovieLens) is
trusted on first use: its SHA-256 is printed and kept in CACHE/DATASET/MANIFEST.json, and later
fetches must match it. Files that need a login upstream (FEMNIST sample, full Kaggle files) come
from a mirror or are placed by hand at CACHE/DATASET/FILE; a placed file that verifies is kept.
Environment: MPI_DP_DATA_CACHE (cache folder), MPI_DP_DATA_MIRROR (default mirror).
"""


def add_fetch_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of `mpi-dp data fetch` to `parser`."""
    parser.description = (
        "Download a dataset's original files from their official URLs (or a mirror) into a cache "
        "folder, CACHE/DATASET/FILE, verifying each by its pinned SHA-256. Files already cached and "
        "verified are not downloaded again."
    )
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "name", nargs="?", metavar="NAME",
        help=f"dataset to fetch: one of {', '.join(registry.DATASETS)}, or 'all'",
    )
    parser.add_argument(
        "--cache", type=Path, default=None, metavar="DIR",
        help=f"cache folder (default: ${CACHE_ENV} or ~/.cache/mpi_dp/data)",
    )
    parser.add_argument(
        "--mirror", default=None, metavar="URL",
        help=f"folder or base URL (file://, https://) laid out as URL/DATASET/FILE, used instead of "
        f"the upstream URLs (default: ${MIRROR_ENV})",
    )
    parser.add_argument("--force", action="store_true", help="download again even if cached and verified")
    parser.add_argument("--list", action="store_true", help="print the table of datasets and files; exit")
    parser.add_argument("--timeout", type=float, default=60, metavar="S",
                        help="network timeout per operation in seconds (default: %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="no progress messages on stderr")


def format_table(datasets: Sequence[Dataset] | None = None) -> str:
    """The --list table: each dataset, its licence, and its files with URL and check."""
    lines = []
    for ds in datasets if datasets is not None else registry.DATASETS.values():
        lines.append(f"{ds.name}: {ds.description}")
        lines.append(f"  licence: {ds.licence}")
        for rf in ds.files:
            size = f"{rf.size:,} B" if rf.size else "size not pinned"
            pin = {"sha256": f"sha256 {rf.sha256}", "content-md5": f"content md5 {rf.content_md5}"}.get(
                rf.check, rf.check if rf.check != "unpinned" else "NOT pinned (trust on first use)"
            )
            lines.append(f"  - {rf.name} ({size}; {pin})")
            lines.append(f"      url: {rf.url or 'none: manual download or --mirror'}")
        lines.append("")
    return "\n".join(lines)


def run_fetch_command(args: argparse.Namespace) -> int:
    """Run `mpi-dp data fetch` from parsed arguments; prints what was fetched, where, sizes, hashes.

    Returns 0 on success, 1 when some datasets of 'all' failed (each error printed on stderr). A
    single named dataset that fails raises DataError.
    """
    if args.list:
        print(format_table())
        return 0
    if not args.name:
        raise DataError(f"name a dataset to fetch ({', '.join(registry.DATASETS)} or all), or use --list")
    names = list(registry.DATASETS) if args.name == "all" else [registry.get(args.name).name]
    failed: list[str] = []
    for name in names:
        try:
            found = fetch_files(name, cache_dir=args.cache, mirror=args.mirror, force=args.force,
                                timeout=args.timeout, progress=not args.quiet)
        except DataError as e:
            if len(names) == 1:
                raise
            failed.append(name)
            print(f"{name}: FAILED: {e}", file=sys.stderr)
            continue
        for f in found:
            how = f"downloaded from {f.url}" if f.downloaded else "already cached"
            print(f"{f.path}  {f.size:,} B  sha256 {f.sha256}  [{f.check}; {how}]")
    if failed:
        print(f"{len(failed)} of {len(names)} datasets failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
