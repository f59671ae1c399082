"""Runs on object storage (`s3://`, `gs://`, `az://`, `abfs://`), read through a local mirror.

Every reader in lossguard works on local files: offsets, inodes, SQLite databases opened read-only,
cursors kept in the daemon's state. So an object store is not read in place: a prefix is listed
(paginated, one request a thousand keys) and its objects are copied into a private folder, which
discovery, the readers and the daemon's follower then read as any other folder. The names shown
(run names, sources, problems) are the URL's: `shown` puts the URL back where a mirror's path is.

Objects are rewritten whole as they grow (TensorBoard's and most writers' uploads). A mirror keeps,
for each key, the version (ETag, else generation or modification time) and size it last copied, so
a listing alone tells an unchanged object (no request at all: an idle prefix costs its listing),
and one that changed is fetched from what the copy already holds: a ranged GET starting a few bytes
before the copy's end. When those few bytes are what the copy ends with, the object grew and only
its new bytes are appended; otherwise (or when it shrank) it is fetched whole and the copy is
rewritten in place, keeping its inode, so the readers see a file rewritten from its start as they
do on disk. A copy is never replaced by another file: the daemon's state knows files by path and
inode, and a restart must find the same ones (nothing fetched again, nothing alerted again).

fsspec (with s3fs, gcsfs or adlfs, the optional extras `lossguard[s3]`, `[gcs]`, `[azure]`) is the
one library here that talks to stores: it is maintained, reads each cloud's standard credentials
(AWS env and profiles, `AWS_ENDPOINT_URL` for S3-compatible stores; GCS application default
credentials; Azure's env), and fetches many ranges concurrently on one event loop. This module owns
it and translates its errors: a store that throttles or fails (503 SlowDown, 429, 5xx, a timeout)
is transient, anything else (no such bucket, access denied) permanent; a message never carries a
presigned URL's query string or a secret from the environment.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import LossguardError, UsageError
from ...redact import remember

SCHEMES: Mapping[str, tuple[str, str, str]] = {
    "s3": ("s3", "s3fs", "s3"),
    "s3a": ("s3", "s3fs", "s3"),
    "gs": ("gcs", "gcsfs", "gcs"),
    "gcs": ("gcs", "gcsfs", "gcs"),
    "az": ("abfs", "adlfs", "azure"),
    "abfs": ("abfs", "adlfs", "azure"),
    "abfss": ("abfs", "adlfs", "azure"),
}
"""URL scheme -> (fsspec protocol, the package that implements it, the lossguard extra that brings it)."""
_URL = re.compile(r"^(?P<scheme>[a-z][a-z0-9]*)://(?P<rest>.*)$", re.IGNORECASE)
OVERLAP = 64
"""Bytes before a copy's end fetched again with its growth, and bytes of its head fetched beside it:
the same bytes at both ends say the object grew (appended to, then uploaded whole), as the readers
tell a grown file on disk by its head and the bytes before their offset; other bytes say it was
rewritten, and it is fetched whole."""
CHUNK = 8 << 20
"""An object is fetched in ranges of at most this many bytes (a large event file is no single request
held in memory), and written to its copy piece after piece."""
BATCH_BYTES = 64 << 20
"""Bytes fetched concurrently at most: a sync's memory, whatever the prefix holds."""
WHOLE_BELOW = 64 << 10
"""A changed object whose copy is smaller than this is fetched whole, in one request: two ranged
requests (its head, its growth) would cost more round trips than its bytes."""
MANIFEST = ".lossguard-mirror.json"
"""What each key's copy was made from, beside the mirror's top folder (never under the root read)."""
URL_FILE = ".lossguard-url"
"""The URL a mirror's folder holds the objects of, for a process that reads the daemon's state and
shows its files (`lossguard status`) as their URLs."""
TRANSIENT_WORDS = ("SlowDown", "503", "429", "500", "502", "504", "Throttl", "TooManyRequests", "reduce your request rate",
                   "ServiceUnavailable", "InternalError", "RequestTimeout", "timed out", "Timeout", "Connection")
_QUERY = re.compile(r"(https?://[^\s?'\"<>]*)\?[^\s'\"<>]*")
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_CLIENT_SECRET",
               "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING", "GOOGLE_OAUTH_ACCESS_TOKEN")


class StoreError(LossguardError):
    """An object store could not be listed or read; `transient` when trying later may work."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def is_url(text: str | os.PathLike[str]) -> bool:
    """Whether a path given on the command line or in the config names an object store."""
    match = _URL.match(str(text)) if isinstance(text, str) else None
    return match is not None and match["scheme"].lower() in SCHEMES


def root(text: str | os.PathLike[str]) -> Path | str:
    """A path given to scan or watch: a URL stays the string it is (a Path would make `s3://b` `s3:/b`)."""
    return text if isinstance(text, str) and is_url(text) else Path(text)


def split_paths(text: str, sep: str = os.pathsep) -> list[str]:
    """Paths joined as $PATH joins them (a:b), where a URL's own `scheme://` is no separator."""
    parts = text.split(sep)
    out: list[str] = []
    for part in parts:
        if out and part.startswith("//") and out[-1].lower() in SCHEMES:
            out[-1] = f"{out[-1]}{sep}{part}"
        elif part:
            out.append(part)
    return out


def normal(url: str) -> str:
    """A URL as lossguard shows it and keys its mirror by: the scheme in lower case, no slash at the end."""
    match = _URL.match(url)
    if match is None or match["scheme"].lower() not in SCHEMES:
        raise UsageError(f"{url}: not an object store URL (s3://, gs://, az://, abfs://)")
    return f"{match['scheme'].lower()}://{match['rest'].strip('/')}"


def redacted(text: str) -> str:
    """An error's text without what grants access: a presigned URL's query (its signature, its
    credential) and the values of the clouds' secret variables, should a server echo them."""
    text = _QUERY.sub(r"\1?…", text)
    for name in _SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 6:
            text = text.replace(value, "***")
    return text


def _translate(exc: BaseException, where: str) -> StoreError:
    """One line naming the URL: what the store said, transient or not."""
    if isinstance(exc, StoreError):
        return exc
    said = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)  # (not "[Errno 16] ...")
    response = getattr(exc.__cause__, "response", None) or getattr(exc, "response", None)
    if isinstance(response, Mapping):  # (botocore's: the HTTP status and the store's own code say most)
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        named = response.get("Error", {}).get("Code")
        said = f"{status or ''} {named or ''}: {said}".strip(" ") if status or named else said
    text = redacted(" ".join(said.split()) or type(exc).__name__)
    code = getattr(exc, "errno", None)
    transient = (
        isinstance(exc, (TimeoutError, ConnectionError))
        or code in (errno.EBUSY, errno.EAGAIN, errno.ETIMEDOUT, getattr(errno, "EREMOTEIO", -1))
        or (not isinstance(exc, (PermissionError, FileNotFoundError)) and any(w in text for w in TRANSIENT_WORDS))
    )
    if isinstance(exc, FileNotFoundError):
        text = f"no such bucket or prefix ({text})"
    elif isinstance(exc, PermissionError):
        text = f"access denied ({text}); credentials come from the cloud's standard chain (for S3: AWS_* variables, profiles, AWS_ENDPOINT_URL)"
    return StoreError(f"{where}: {text}", transient=transient)


def _filesystem(protocol: str, package: str, extra: str, *, retries: int) -> Any:
    """The store's fsspec filesystem, or a usage error naming the extra that brings it."""
    try:
        import fsspec

        cls = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError):
        raise UsageError(f"reading {protocol}:// URLs needs {package}: pip install 'lossguard[{extra}]'") from None
    for name in _SECRET_ENV:  # (scrubbed from every line lossguard writes, a traceback's too)
        if os.environ.get(name):
            remember(os.environ[name])
    options: dict[str, Any] = {"skip_instance_cache": True}
    if protocol == "s3":
        # botocore reads AWS_ENDPOINT_URL itself in recent versions; said here for the older ones.
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            options["endpoint_url"] = endpoint
        options["config_kwargs"] = {"retries": {"max_attempts": retries, "mode": "standard"}}
    if protocol == "gcs" and os.environ.get("STORAGE_EMULATOR_HOST"):
        # An emulator (gcsfs reads STORAGE_EMULATOR_HOST itself) takes no credentials and speaks the
        # JSON API only: gcsfs' own class, not the one that first asks a bucket's layout over gRPC
        # (a minute's timeout against an emulator).
        from gcsfs.core import GCSFileSystem

        cls, options["token"] = GCSFileSystem, "anon"
    fs = cls(**options)
    if protocol == "s3":
        fs.retries = retries  # (s3fs' own retries, around botocore's)
    return fs


@dataclass(frozen=True)
class Listed:
    """An object as the listing gave it."""

    key: str
    """Its path below the mirrored prefix (`run1/events.out.tfevents...`)."""
    size: int
    version: str


@dataclass
class SyncReport:
    """What one sync did, for the log and the tests."""

    fetched: int = 0
    appended: int = 0
    rewritten: int = 0
    removed: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    """Keys that name no file a folder can hold (`a/../b`, `a/b` beside a key `a`): said, not copied."""
    failed: list[StoreError] = field(default_factory=list)
    """Objects that could not be fetched this time (tried again at the next sync)."""


def _version(info: Mapping[str, Any]) -> str:
    for name in ("ETag", "etag", "generation", "md5Hash", "LastModified", "last_modified", "mtime", "updated"):
        if info.get(name) not in (None, ""):
            return str(info[name])
    return ""


def _local_key(key: str) -> str | None:
    """A key as a relative path, or None when it names no file a folder can hold safely."""
    parts = key.split("/")
    if any(p in ("", ".", "..") or "\0" in p for p in parts):
        return None
    return key


class Mirror:
    """A prefix of an object store copied into `cache` (a folder of its own), kept up to date by `sync`."""

    def __init__(self, url: str, *, cache: Path, jobs: int = 8, retries: int = 3,
                 filesystem: Callable[..., Any] = _filesystem) -> None:
        self.url = normal(url)
        scheme, _, self.prefix = self.url.partition("://")
        if not self.prefix:
            raise UsageError(f"{url}: no bucket named")
        protocol, package, extra = SCHEMES[scheme]
        self.fs = filesystem(protocol, package, extra, retries=retries)
        # The prefix as the store's listings name it (`abfs://c@account.dfs.core.windows.net/p` is `c/p`).
        self.prefix = str(getattr(self.fs, "_strip_protocol", lambda u: self.prefix)(self.url)).strip("/") or self.prefix
        # The mirror's root has the prefix's own name: a run found at the root is named after it,
        # as the same folder on disk would be.
        self.top = cache
        self.root = cache / self.prefix
        self.jobs = max(1, jobs)
        self._manifest_path = cache / MANIFEST
        self._manifest: dict[str, list[Any]] = self._load_manifest()
        cache.mkdir(parents=True, exist_ok=True)
        if not (cache / URL_FILE).is_file():
            (cache / URL_FILE).write_text(self.url + "\n", encoding="utf-8")
        self.is_file = False
        """Whether the URL names one object rather than a prefix (set by the first listing)."""

    def _load_manifest(self) -> dict[str, list[Any]]:
        try:
            data = json.loads(self._manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}  # (none yet, or torn: every copy is checked against its object once)
        return data if isinstance(data, dict) else {}

    def _save_manifest(self) -> None:
        tmp = self._manifest_path.with_name(self._manifest_path.name + ".tmp")
        tmp.write_text(json.dumps(self._manifest, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self._manifest_path)

    def listing(self) -> list[Listed]:
        """Every object under the prefix (or the one object it names): paginated by the store's client."""
        self.fs.invalidate_cache()  # (fsspec keeps listings; a mirror wants the store's, every time)
        try:
            found = self.fs.find(self.prefix, detail=True)
        except Exception as exc:  # noqa: BLE001 - the store's errors, whatever the library, translated here
            raise _translate(exc, self.url) from None
        base = self.prefix + "/"
        out = []
        for path, info in found.items():
            path = path.strip("/")
            if info.get("type") == "directory":
                continue
            if path == self.prefix:  # the URL names one object
                self.is_file = True
                if self.root.is_dir() and not any(self.root.iterdir()):
                    self.root.rmdir()  # (made by `prepare` before the store said what the URL is)
                out.append(Listed(Path(path).name, int(info.get("size") or 0), _version(info)))
            elif path.startswith(base):
                out.append(Listed(path[len(base):], int(info.get("size") or 0), _version(info)))
        return out

    def prepare(self) -> None:
        """The root folder made before the first sync, so that a store that cannot be listed at the
        start leaves an empty folder to follow, not a missing path (which would be a usage error)."""
        if not self.root.exists():
            self.root.mkdir(parents=True)

    def local(self) -> Path:
        """The path the readers are given: the mirror's root folder, or the one object's copy."""
        return self.root

    def _where(self, key: str) -> tuple[str, Path]:
        if self.is_file:
            return self.prefix, self.root
        return f"{self.prefix}/{key}", self.root / key

    def sync(self) -> SyncReport:
        """List the prefix and bring every copy to its object: fetch what is new, append what grew,
        rewrite what was rewritten, remove what is gone. Raises StoreError when the listing fails
        (nothing is changed then); an object that cannot be fetched is in the report's `failed`."""
        objects = self.listing()
        report = SyncReport()
        names = {o.key for o in objects}
        wanted: list[tuple[Listed, str, Path, int]] = []
        for obj in objects:
            # A key below another key (`a/b` beside `a`): a file cannot be a folder too; the file stays.
            below = any(obj.key[:i] in names for i in range(len(obj.key)) if obj.key[i] == "/")
            if _local_key(obj.key) is None or below:
                report.skipped.append(f"{self.url}/{obj.key}")
                continue
            remote, path = self._where(obj.key)
            try:
                have = path.stat().st_size if path.is_file() else -1
            except OSError:
                have = -1
            if have == obj.size and self._manifest.get(obj.key) == [obj.version, obj.size]:
                continue  # unchanged: the listing said so, no request
            if obj.size == 0:  # (nothing to fetch: a range of no bytes is no request a store takes)
                self._rewrite(path, b"")
                self._manifest[obj.key] = [obj.version, obj.size]
                report.fetched += 1
                continue
            # A large copy no longer than its object: its growth (with the bytes before it); a small
            # one, or none: the object whole; one longer than its object: whole, and rewritten.
            start = -1 if have > obj.size else have - OVERLAP if have >= WHOLE_BELOW else 0
            wanted.append((obj, remote, path, start))
        self._fetch(wanted, report)
        for key in [k for k in self._manifest if k not in names]:
            _, path = self._where(key)
            try:
                path.unlink()
                report.removed += 1
            except OSError:
                pass
            self._manifest.pop(key, None)
        if wanted or report.removed:
            self._save_manifest()
        return report

    def _fetch(self, wanted: Sequence[tuple[Listed, str, Path, int]], report: SyncReport) -> None:
        """The objects' missing bytes, fetched concurrently (at most `jobs` requests at a time), then
        fetched whole again where the bytes a copy holds turned out to have changed. `start` is
        where a copy's growth is fetched from (its head is fetched beside it), 0 for an object
        fetched whole, -1 for one fetched whole that is shorter than its copy."""
        again = self._pieces(wanted, report)
        if again:
            self._pieces([(obj, remote, path, -1) for obj, remote, path, _ in again], report)

    def _pieces(self, wanted: Sequence[tuple[Listed, str, Path, int]], report: SyncReport) -> list[tuple[Listed, str, Path, int]]:
        """`wanted` fetched in pieces of at most CHUNK bytes, BATCH_BYTES at a time, so that memory
        stays bounded whatever the objects' sizes; each copy written in order, piece after piece. A
        copy whose fetch stops (a failed request) is left a prefix of its object, which the readers
        take for a file still being written, and goes on from there at the next sync. Returns the
        growths whose bytes before them were not the copy's: the objects were rewritten."""
        pieces = [(n, at, min(obj.size, at + CHUNK)) for n, (obj, _, _, start) in enumerate(wanted) for at in range(max(0, start), obj.size, CHUNK)]
        stopped: set[int] = set()
        again: list[tuple[Listed, str, Path, int]] = []
        batch: list[tuple[int, int, int]] = []
        held = 0
        for k, piece in enumerate(pieces):
            batch.append(piece)
            held += piece[2] - piece[1]
            if k + 1 < len(pieces) and held + CHUNK <= BATCH_BYTES:
                continue
            batch = [p for p in batch if p[0] not in stopped]  # (the rest of a copy whose fetch stopped: not asked)
            firsts = [(n, at) for n, at, _ in batch if at == max(0, wanted[n][3]) and wanted[n][3] > 0]
            asked = [(wanted[n][1], at, end) for n, at, end in batch] + [(wanted[n][1], 0, OVERLAP) for n, _ in firsts]
            got = self._ranges(asked, report)
            heads = {n: data for (n, _), data in zip(firsts, got[len(batch):])}
            for (n, at, end), data in zip(batch, got):
                obj, _, path, start = wanted[n]
                if n in stopped or data is None or heads.get(n, b"") is None:
                    stopped.add(n)
                    continue
                if at == max(0, start):
                    written = self._append(path, start, data, heads[n]) if start > 0 else self._rewrite(path, data)
                else:
                    written = self._extend(path, at, data)
                if not written:
                    stopped.add(n)
                    again += [wanted[n]] if at == start else []
                    continue
                report.bytes += len(data)
                if end == obj.size:
                    report.appended += start > 0
                    report.fetched += start == 0
                    report.rewritten += start < 0
                    self._manifest[obj.key] = [obj.version, obj.size]
            batch, held = [], 0
        return again

    def _ranges(self, asked: Sequence[tuple[str, int, int]], report: SyncReport) -> list[bytes | None]:
        if not asked:
            return []
        paths, starts, ends = zip(*asked)
        try:
            got = self.fs.cat_ranges(list(paths), list(starts), list(ends), batch_size=self.jobs, on_error="return")
        except Exception as exc:  # noqa: BLE001 - translated here
            report.failed.append(_translate(exc, self.url))
            return [None] * len(asked)
        out: list[bytes | None] = []
        for (path, _, _), data in zip(asked, got):
            if isinstance(data, BaseException):
                report.failed.append(_translate(data, f"{self.url.split('://')[0]}://{path}"))
                out.append(None)
            else:
                out.append(bytes(data))
        return out

    @staticmethod
    def _append(path: Path, start: int, data: bytes, head: bytes) -> bool:
        """Append the bytes past the copy's end when the object's head and the bytes before that end
        are the copy's own; False if not (the object was rewritten)."""
        with open(path, "r+b") as fh:
            if fh.read(len(head)) != head:
                return False
            fh.seek(start)
            have = fh.read()
            if not data.startswith(have):
                return False
            fh.write(data[len(have):])
        return True

    @staticmethod
    def _rewrite(path: Path, data: bytes) -> bool:
        """The copy made the object's first bytes, in place (same inode): never replaced by another file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "r+b" if path.is_file() else "wb") as fh:
            fh.write(data)
            fh.truncate()
        return True

    @staticmethod
    def _extend(path: Path, at: int, data: bytes) -> bool:
        """A piece after the first written where the copy ends; False if it ends elsewhere."""
        with open(path, "r+b") as fh:
            if fh.seek(0, os.SEEK_END) != at:
                return False
            fh.write(data)
        return True

    def shown(self, text: str) -> str:
        """A text where the mirror's paths are the URL's."""
        local = str(self.local())
        return text.replace(local, self.url) if local in text else text


def shown_path(path: str, objects: Path) -> str:
    """A file of a mirror under `objects` (the folder cache_for was given) as its object's URL;
    any other path as it is."""
    rel = os.path.relpath(path, objects)
    if rel.startswith(".."):
        return path
    digest, _, below = rel.partition(os.sep)
    try:
        url = (objects / digest / URL_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return path
    prefix = url.partition("://")[2]
    return url + below[len(prefix):] if below == prefix or below.startswith(prefix + "/") else path


def cache_for(url: str, parent: Path) -> Path:
    """A mirror's own folder under `parent`, the same for the same URL at every start (its copies
    keep their inodes for the daemon's state), another for another URL."""
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    return parent / digest
