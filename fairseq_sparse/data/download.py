"""Fetching raw data: the official files of a dataset (``--download``), verified before they are used.

Every file a dataset needs is an entry of ``configs/downloads.yaml``: its mirrors in the order they
are tried, and for each mirror the file it serves with its expected size and SHA-256 and where those
numbers come from. A download can poison a run only by leaving a file under its final name, so:

- a mirror's file is fetched to ``.NAME.part`` (resumed with an HTTP range request after a cut
  connection, retried with backoff on errors a retry can cure), its type checked (an HTML page is not
  an archive), its size and hash (SHA-256, or MD5 where that is all its publishers give) checked, and
  only then renamed to ``NAME``;
- an archive is extracted into a hidden directory first and moved into place after it extracted whole;
- any failure (an HTTP error, the wrong type, size or hash, an archive that does not extract) moves on
  to the next mirror, and when none is left the one error names every URL tried and why it failed;
- a file already in the raw directory is used only if it passes the same checks (once: a marker
  remembers the size and time it was verified at); one that fails is set aside as ``NAME.rejected``.

A mirror whose host publishes no hash is verified against what its first download on this machine
saw (pinned in the download cache, ``pins.json``), and the log says so.
"""

import dataclasses
import errno
import functools
import hashlib
import http.client
import json
import logging
import os
import shutil
import socket
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import yaml

from fairseq_sparse.data.errors import PrepError
from fairseq_sparse.files import write_atomically

logger = logging.getLogger("fairseq_sparse.data")

CATALOGUE = Path(__file__).resolve().parent.parent / "configs" / "downloads.yaml"
ATTEMPTS = 4          # per mirror, for errors a retry can cure (timeouts, 5xx, cut connections)
BACKOFF_S = 5.0       # seconds before the second attempt, doubled before each further one
TIMEOUT_S = 60
CHUNK = 1 << 20


def cache_dir() -> Path:
    """Where downloaded corpora (the Bible database, the Bible alignments) and the pinned hashes are
    kept: $FAIRSEQ_SPARSE_CACHE or ~/.cache/fairseq-sparse."""
    env = os.environ.get("FAIRSEQ_SPARSE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fairseq-sparse"


@dataclasses.dataclass(frozen=True)
class Mirror:
    """One place a raw file can be fetched from: its URL (or the URLs of the parts of a split archive,
    concatenated), the name it is saved under, and what it must be."""

    parts: Tuple[str, ...]
    file: str
    size: Optional[int] = None
    sha256: Optional[str] = None
    md5: Optional[str] = None     # where a host's or tool's MD5 is all that is published
    checksum_from: str = ""       # where size and hash were read, or why there are none

    @property
    def published(self) -> bool:
        return self.size is not None or self.sha256 is not None or self.md5 is not None

    @property
    def url(self) -> str:
        return " + ".join(self.parts)


@dataclasses.dataclass(frozen=True)
class RawFile:
    """One file a dataset needs, with its mirrors in the order they are tried."""

    id: str
    mirrors: Tuple[Mirror, ...]


def _mirror(entry_id: str, served: dict) -> Mirror:
    parts = tuple(served["parts"]) if "parts" in served else (served["url"],)
    file = served.get("file") or parts[0].rstrip("/").split("/")[-1].split("=")[-1]
    if len(parts) > 1 and "file" not in served:
        raise ValueError(f"downloads.yaml: {entry_id}: a split archive needs its file name")
    sha, md5 = served.get("sha256"), served.get("md5")
    return Mirror(parts, file, served.get("size"), sha.lower() if sha else None, md5.lower() if md5 else None,
                  served.get("checksum_from", ""))


@functools.lru_cache(maxsize=None)
def catalogue(path: Path = CATALOGUE) -> Dict[str, RawFile]:
    """Every downloadable raw file by id (``configs/downloads.yaml``)."""
    with open(path, encoding="utf-8") as f:
        entries = yaml.safe_load(f)
    return {key: RawFile(key, tuple(_mirror(key, m) for m in entry["mirrors"])) for key, entry in entries.items()}


def raw_file(key: str) -> RawFile:
    try:
        return catalogue()[key]
    except KeyError:
        raise PrepError(f"no download entry {key!r} in {CATALOGUE}") from None


def download(files: Sequence, raw_dir: Path) -> None:
    """Fetch and verify each file (an id of the catalogue, or a ``RawFile``) into ``raw_dir`` and extract
    the archives (.tgz, .tar.gz, .tar, .zip; a lone .gz is read as it is)."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    for item in files:
        fetch_verified(item if isinstance(item, RawFile) else raw_file(item), raw_dir)


class MirrorFailed(Exception):
    """This mirror cannot give the file; the next one is tried."""


def fetch_verified(entry: RawFile, raw_dir: Path) -> Path:
    """The verified (and, for an archive, extracted) file of the first mirror that gives one: a file
    already in ``raw_dir`` if it passes the checks (else it is set aside), otherwise a download."""
    for mirror in entry.mirrors:
        dest = raw_dir / mirror.file
        if dest.exists():
            try:
                return _ready(mirror, dest, raw_dir, lambda: _verify_kept(mirror, dest))
            except MirrorFailed as e:
                rejected = dest.with_name(dest.name + ".rejected")
                os.replace(dest, rejected)
                _verified_marker(dest).unlink(missing_ok=True)
                logger.warning("%s: %s; set aside as %s, downloading again", dest, e, rejected.name)
    failures = []
    for mirror in entry.mirrors:
        dest = raw_dir / mirror.file
        try:
            return _ready(mirror, dest, raw_dir, lambda: _fetch(mirror, dest))
        except MirrorFailed as e:
            dest.unlink(missing_ok=True)
            _verified_marker(dest).unlink(missing_ok=True)
            failures.append(f"{mirror.url} ({e})")
            logger.warning("%s: %s; trying the next mirror", mirror.url, e)
    raise PrepError(f"could not download {entry.id} into {raw_dir}; tried: " + "; ".join(failures))


def _ready(mirror: Mirror, dest: Path, raw_dir: Path, obtain) -> Path:
    """``dest`` once ``obtain`` (a check of the kept file, or a download) has made it, extracted and, for
    a mirror whose host publishes no checksum, pinned."""
    obtain()
    _extract(dest, raw_dir)
    _pin_if_new(mirror, dest)
    return dest


def _fetch(mirror: Mirror, dest: Path) -> None:
    """Fetch ``mirror``'s parts into ``.NAME.part``, check it, rename it to ``dest``. A cut download
    stays behind for the next attempt or run to resume; one that fails its checks is removed."""
    partial = dest.with_name(f".{dest.name}.part")
    offset = 0
    for url in mirror.parts:
        offset = _fetch_part(url, partial, offset)
    try:
        _verify(mirror, partial)
    except MirrorFailed:
        partial.unlink()
        raise
    os.replace(partial, dest)
    _remember_verified(dest)


def _fetch_part(url: str, partial: Path, offset: int) -> int:
    """Append ``url``'s body to ``partial`` from ``offset`` (the parts before it end there), resuming
    what a cut connection or an earlier run left; return the new end."""
    done = partial.stat().st_size - offset if partial.exists() else 0
    if done < 0:
        partial.unlink()
        done = 0
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return offset + _get(url, partial, offset, done)
        except _Transient as e:
            done = partial.stat().st_size - offset if partial.exists() else 0
            if attempt == ATTEMPTS:
                raise MirrorFailed(f"{e}, {ATTEMPTS} attempts") from None
            wait = BACKOFF_S * 2 ** (attempt - 1)
            logger.warning("%s: %s; attempt %d of %d in %.0f s (resuming at byte %d)",
                           url, e, attempt + 1, ATTEMPTS, wait, done)
            time.sleep(wait)
    raise AssertionError("unreachable")


class _Transient(Exception):
    """An error that a later attempt may not meet: a timeout, a cut connection, a 5xx or 429."""


def _get(url: str, partial: Path, offset: int, done: int) -> int:
    """One request for ``url`` from byte ``done``; the body goes to ``partial`` at ``offset + done``."""
    request = urllib.request.Request(url, headers={"User-Agent": "fairseq-sparse"})
    if done:
        request.add_header("Range", f"bytes={done}-")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            if done and response.status != 206:
                done = 0        # the server ignored the range: start the part again
            expected = response.headers.get("Content-Length")
            logger.info("downloading %s%s", url, f" from byte {done}" if done else "")
            with open(partial, "r+b" if partial.exists() else "wb") as f:
                f.seek(offset + done)
                f.truncate()
                received = 0
                while True:
                    chunk = response.read(CHUNK)
                    if not chunk:
                        break
                    f.write(chunk)
                    received += len(chunk)
            if expected is not None and received < int(expected):
                raise _Transient(f"connection closed after {received} of {expected} bytes")
            return done + received
    except urllib.error.HTTPError as e:
        if e.code == 416 and done:   # the range starts at the end: the part was complete
            return done
        if e.code >= 500 or e.code == 429:
            raise _Transient(f"HTTP {e.code}") from None
        raise MirrorFailed(f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, FileNotFoundError):     # a file:// mirror (a local copy) that is not there
            raise MirrorFailed(f"no such file: {e.reason.filename}") from None
        raise _Transient(f"{type(e).__name__}: {e.reason}") from None
    except (socket.timeout, http.client.IncompleteRead, ConnectionError, TimeoutError) as e:
        reason = e
        raise _Transient(f"{type(e).__name__}: {reason}") from None


# ---- verification --------------------------------------------------------------------------------

MAGIC = {".gz": (0, b"\x1f\x8b"), ".tgz": (0, b"\x1f\x8b"), ".zip": (0, b"PK\x03\x04"), ".tar": (257, b"ustar")}


def _kind(name: str) -> str:
    for suffix in (".tar.gz", ".tgz", ".gz", ".zip", ".tar"):
        if name.endswith(suffix):
            return ".tgz" if suffix == ".tar.gz" else suffix
    return "text"


def _check_type(name: str, path: Path) -> None:
    with open(path, "rb") as f:
        head = f.read(4096)
    kind = _kind(name)
    if head.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html")):
        raise MirrorFailed("an HTML page, not " + ("a text file" if kind == "text" else f"a {kind} file"))
    if kind == "text":
        if b"\x00" in head:
            raise MirrorFailed("binary data, not a text file")
        return
    at, magic = MAGIC[kind]
    if head[at:at + len(magic)] != magic:
        raise MirrorFailed(f"not a {kind} file")


DIGEST_NAMES = {"sha256": "SHA-256", "md5": "MD5"}


def digest_of(path: Path, algorithm: str = "sha256") -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _verify(mirror: Mirror, path: Path) -> None:
    """Type, size and SHA-256 of ``path`` against the catalogue, else against the pin of the first
    download of ``mirror`` on this machine, if there is one."""
    _check_type(mirror.file, path)
    size, source = mirror.size, mirror.checksum_from or "downloads.yaml"
    digests = {"sha256": mirror.sha256, "md5": mirror.md5}
    if not mirror.published:
        pin = _pins().get(mirror.url, {})
        size, digests = pin.get("size"), {"sha256": pin.get("sha256")}
        source = f"its first download here ({pins_path()})"
    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        raise MirrorFailed(f"{actual_size} bytes where {source} says {size}")
    for algorithm, expected in digests.items():
        if expected is not None:
            actual = digest_of(path, algorithm)
            if actual != expected:
                raise MirrorFailed(f"{DIGEST_NAMES[algorithm]} {actual[:12]}... where {source} says {expected[:12]}...")


def pins_path() -> Path:
    return cache_dir() / "pins.json"


def _pins() -> Dict[str, dict]:
    path = pins_path()
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _pin_if_new(mirror: Mirror, path: Path) -> None:
    """Pin the size and hash of a file whose host publishes none, once it has passed every other check
    (extraction included), so that later downloads must match what this one saw."""
    pins = _pins()
    if mirror.published or mirror.url in pins:
        return
    size, sha = path.stat().st_size, digest_of(path)
    pins[mirror.url] = {"size": size, "sha256": sha, "pinned": time.strftime("%Y-%m-%d")}
    pins_path().parent.mkdir(parents=True, exist_ok=True)
    write_atomically(pins_path(), json.dumps(pins, indent=1, sort_keys=True) + "\n")
    logger.warning("%s: its host publishes no checksum; pinned what this first download saw (%d bytes, "
                   "SHA-256 %s) in %s: later downloads must match it", mirror.url, size, sha, pins_path())


def _verified_marker(path: Path) -> Path:
    return path.with_name(f".{path.name}.verified")


def _remember_verified(path: Path) -> None:
    stat = path.stat()
    write_atomically(_verified_marker(path), f"{stat.st_size} {stat.st_mtime_ns}\n")


def _verify_kept(mirror: Mirror, path: Path) -> None:
    """A file already in the raw directory: verified once, then trusted while its size and time stay."""
    stat = path.stat()
    marker = _verified_marker(path)
    if marker.exists() and marker.read_text().split() == [str(stat.st_size), str(stat.st_mtime_ns)]:
        return
    _verify(mirror, path)
    _remember_verified(path)


# ---- extraction ----------------------------------------------------------------------------------

def _extracted_marker(path: Path) -> Path:
    return path.with_name(f".{path.name}.extracted")


def _extract(path: Path, raw_dir: Path) -> None:
    """Extract an archive into ``raw_dir`` unless its marker says it was: into a hidden directory
    first, moved into place once it extracted whole. An archive that does not extract fails its mirror."""
    kind = _kind(path.name)
    marker = _extracted_marker(path)
    if kind not in (".tgz", ".tar", ".zip") or marker.exists():
        return
    staging = raw_dir / f".{path.name}.extracting"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        if kind == ".zip":
            with zipfile.ZipFile(path) as z:
                z.extractall(staging)
        else:
            with tarfile.open(path) as t:
                t.extractall(staging, filter="data")
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        if e.errno in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT):   # ours, not the archive's
            raise PrepError(f"cannot extract {path} into {raw_dir}: {e.strerror}") from None
        raise MirrorFailed(f"does not extract: {type(e).__name__}: {e}") from None
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, ValueError) as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise MirrorFailed(f"does not extract: {type(e).__name__}: {e}") from None
    for entry in sorted(staging.iterdir()):
        target = raw_dir / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        os.replace(entry, target)
    staging.rmdir()
    marker.touch()
