"""The daemon's memory, in one SQLite file (WAL): what it follows and how far it read, the tail of
each stream that the windows continue from, the incidents it raised, and an outbox of notifications
not yet delivered. A pass's offsets, incidents and outbox entries are committed in one transaction,
so after a crash the daemon resumes exactly where its last commit left it: nothing raised twice,
nothing lost."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sqlite3
import struct
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

import numpy as np

from ..errors import LossguardError
from ..escaping import decodable
from ..model import Incident, Notice
from ..silences import Silence, covering

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY, run TEXT NOT NULL, format TEXT, device INTEGER, inode INTEGER,
    fingerprint BLOB, cursor TEXT NOT NULL, dead INTEGER NOT NULL DEFAULT 0, quiet INTEGER NOT NULL DEFAULT 0,
    mtime INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS streams (
    run TEXT NOT NULL, metric TEXT NOT NULL, tail BLOB NOT NULL, seen INTEGER NOT NULL,
    PRIMARY KEY (run, metric)
);
CREATE TABLE IF NOT EXISTS latest (
    run TEXT NOT NULL, metric TEXT NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (run, metric)
);
CREATE TABLE IF NOT EXISTS runs (
    run TEXT PRIMARY KEY, last_step INTEGER, advanced_at REAL, stalled INTEGER NOT NULL DEFAULT 0,
    touched INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS incidents (
    id INTEGER PRIMARY KEY, run TEXT NOT NULL, rule TEXT NOT NULL, step INTEGER NOT NULL,
    status TEXT NOT NULL, body TEXT NOT NULL, quiet INTEGER NOT NULL DEFAULT 0,
    notified_value REAL, notified_at REAL, top_cause TEXT, thread TEXT, source TEXT NOT NULL DEFAULT '', parent INTEGER,
    opened_at REAL,
    UNIQUE (run, rule, step)
);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY, incident_id INTEGER, sink TEXT NOT NULL DEFAULT '', kind TEXT NOT NULL, payload TEXT NOT NULL,
    created REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, permanent INTEGER NOT NULL DEFAULT 0,
    sent_at REAL, silenced INTEGER
);
CREATE TABLE IF NOT EXISTS silences (
    id INTEGER PRIMARY KEY, run TEXT NOT NULL, rule TEXT, metric TEXT, cause TEXT, starts REAL NOT NULL, ends REAL NOT NULL,
    comment TEXT NOT NULL DEFAULT '', author TEXT NOT NULL DEFAULT '', created REAL NOT NULL, expired REAL, reported REAL
);
CREATE TABLE IF NOT EXISTS plots (
    incident_id INTEGER NOT NULL, sink TEXT NOT NULL, picture TEXT NOT NULL, created REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, done_at REAL, error TEXT,
    PRIMARY KEY (incident_id, sink)
);
CREATE INDEX IF NOT EXISTS outbox_incident ON outbox (incident_id);
CREATE INDEX IF NOT EXISTS silences_unreported ON silences (ends) WHERE reported IS NULL;
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY, sink TEXT NOT NULL, role TEXT NOT NULL, channel TEXT, ts TEXT, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS message_incidents (
    message INTEGER NOT NULL, incident_id INTEGER NOT NULL, PRIMARY KEY (message, incident_id)
);
CREATE INDEX IF NOT EXISTS message_incidents_incident ON message_incidents (incident_id);
CREATE INDEX IF NOT EXISTS messages_in_doubt ON messages (sink) WHERE ts IS NULL;
"""


VERSION = 8
"""The layout of state.db, kept in SQLite's user_version. A later layout adds a step to MIGRATIONS
(the statements that take version N - 1 to N), run in one transaction when an older file is opened.
Version 0 is a file from before versions were kept: its layout is version 1's. Version 2 writes
stream tails as packed numbers (TAIL_FORMAT) instead of JSON; version 1's JSON tails are still read.
Version 3 gives an outbox entry its sink and an incident its source as columns (they were keys in
the JSON), and stores incidents and notices losslessly (model.Incident.to_json); the older JSON is
still read. Version 4 links an incident to the one it escalates (`parent`: a loss spike following a
grad-norm spike), whose alert thread it shares. Version 5 keeps when an incident was raised
(`opened_at`: Alertmanager's startsAt, which every re-send must repeat); older incidents take the
time of their first outbox entry. Version 6 keeps each stream's latest value in a small table of
its own (`latest`), so a metrics scrape does not read every tail. Version 7 keeps the operator's
silences (`silences`) and marks the outbox entries a silence held back (`outbox.silenced`: its id),
which are reported when the silence ends if their incident is still open; keeps the picture of each
announced incident for each sink that shows it (`plots`: the curves as they were when the alert was
raised, drawn and sent after the alert) and indexes the outbox by incident (to find the alert a
picture follows); numbers the commits that change what a run's metrics show (`runs.touched`, meta
`touched`), so a scrape renders again only the runs a pass changed; and fills `latest` for streams
not written since layout 6. Version 8 keeps the messages lossguard posted in a sink with threads
(`messages`: channel and ts, whether it is an incident's own alert or a burst's summary, and
`message_incidents`: the incidents it is the alert of or lists), so a resolution rewrites the
right message after any restart; a summary's row is written before it is sent (ts empty until
Slack accepts it: a restart that finds it so knows the summary may have gone out). Alerts posted
before layout 8 are not in it (their headers are not rewritten). An older lossguard refuses a newer
file rather than misread it."""
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (),
    2: (),
    3: (
        "ALTER TABLE outbox ADD COLUMN sink TEXT NOT NULL DEFAULT ''",
        "UPDATE outbox SET sink = coalesce(json_extract(payload, '$.sink'), '')",
        "ALTER TABLE incidents ADD COLUMN source TEXT NOT NULL DEFAULT ''",
        "UPDATE incidents SET source = coalesce(json_extract(body, '$.source'), '')",
    ),
    4: ("ALTER TABLE incidents ADD COLUMN parent INTEGER",),
    5: (
        "ALTER TABLE incidents ADD COLUMN opened_at REAL",
        "UPDATE incidents SET opened_at = coalesce((SELECT min(created) FROM outbox WHERE incident_id = incidents.id), notified_at) WHERE opened_at IS NULL",
    ),
    6: (),  # the `latest` table (SCHEMA creates it); filled as passes write tails
    7: (  # (and the `silences` and `plots` tables and the outbox's index, which SCHEMA creates)
        "ALTER TABLE outbox ADD COLUMN silenced INTEGER",
        "ALTER TABLE runs ADD COLUMN touched INTEGER NOT NULL DEFAULT 0",
        "INSERT OR IGNORE INTO latest (run, metric, value) SELECT run, metric, substr(tail, -8) FROM streams WHERE typeof(tail)='blob' AND length(tail) >= 16",
    ),
    8: (),  # the `messages` and `message_incidents` tables (SCHEMA creates them)
}
"""(An ADD COLUMN whose column exists is skipped: the step may meet a file that already has it.)"""
TAIL_FORMAT = ("<i8", "<f8")
"""A tail on disk: its steps (int64), then its values (float64, NaN and infinities as they are)."""


class StateLocked(LossguardError):
    """Another lossguard daemon holds this state directory."""


class StateError(LossguardError):
    """The state directory or file cannot be used as it is (not a folder, not writable, not a
    database): the operator has to fix it, so the daemon refuses to start rather than fail every pass."""


class StateBusy(StateError):
    """Another writer held the state's write lock longer than this connection waits (an outside
    `sqlite3` shell in a transaction, a stuck disk): the write was not made."""


DAMAGED = {11, 26}
"""SQLite's primary result codes for a file that is not (or no longer) a sound database: CORRUPT and
NOTADB. Such a file is moved aside and the state starts fresh; any other error (read-only, cannot
open, I/O) is the operator's to fix and must not cost the state."""


BUSY = {5, 6}
"""SQLite's BUSY and LOCKED: another connection holds the lock this one waited for."""


class _Damaged(sqlite3.DatabaseError):
    """quick_check found the file damaged."""


_WHO = f"the user lossguard runs as (uid {os.getuid()}) must be able to read and write it and create files beside it"


def _damaged(exc: sqlite3.DatabaseError) -> bool:
    return isinstance(exc, _Damaged) or (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in DAMAGED


def _claim(directory: Path) -> int:
    """The state directory, created private (0700) when missing, and locked for this process. The
    lock is on the directory itself, which nobody deletes by hand while keeping the state (a lock
    file was: and a second daemon then started on the same state)."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise StateError(f"{directory}: the state directory is a file, not a folder") from None
    except OSError as exc:
        raise StateError(f"{directory}: cannot create the state directory: {exc.strerror or exc}") from None
    if not directory.is_dir():
        raise StateError(f"{directory}: the state directory is not a folder")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise StateError(f"{directory}: the state directory is not writable by this user (uid {os.getuid()})")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StateLocked(f"{directory}: another lossguard daemon is using this state directory") from None
        raise StateError(f"{directory}: cannot lock the state directory: {exc.strerror or exc}") from None
    return fd


class StateTooNew(LossguardError):
    """The state file was written by a newer lossguard, whose layout this one does not know."""


@dataclass(frozen=True)
class FileRow:
    path: str
    run: str
    format: str | None
    device: int
    inode: int
    fingerprint: bytes
    cursor: str
    dead: bool
    quiet: int
    """Offset up to which the file is history from before the daemon's first start: read for the
    windows, not alerted on (0: nothing is; databases from before this wrote 1 = the first read)."""
    mtime: int = 0
    """st_mtime_ns when last read: an unchanged size with a new mtime means rewritten in place."""


@dataclass(frozen=True)
class Tail:
    """The last points of one stream, as committed: what the next pass's windows continue from."""

    steps: np.ndarray
    values: np.ndarray
    seen: int
    """Points the stream has held in all (the tail keeps only the last of them)."""

    @classmethod
    def empty(cls) -> Tail:
        return cls(np.empty(0, np.int64), np.empty(0, np.float64), 0)


@dataclass(frozen=True)
class RunRow:
    run: str
    last_step: int | None
    advanced_at: float | None
    """When the run last logged a new step (the daemon's clock)."""
    stalled: bool


@dataclass(frozen=True)
class IncidentRow:
    """An incident as raised, and what was last said about it (the notification log)."""

    id: int
    status: str
    """open | resolved"""
    incident: Incident
    source: str
    quiet: bool
    """Raised from history found at the first start: recorded, never announced."""
    notified_value: float | None
    notified_at: float | None
    top_cause: str | None
    thread: str | None
    """`channel|ts` of the Slack message the incident's follow-ups reply to."""
    opened_at: float | None = None
    """When the daemon raised it (wall clock): Alertmanager's startsAt."""


@dataclass(frozen=True)
class OutboxEntry:
    id: int
    incident_id: int | None
    sink: str
    notice: Notice
    attempts: int
    key: str = ""
    """`<state id>-<id>`: unique across state files (a state moved aside and started over counts
    its ids from 1 again), so a sink that deduplicates by it is never fooled."""
    created: float = 0.0
    """When the notice was raised (wall clock): a resolution's endsAt."""
    opened_at: float | None = None
    """When its incident was raised (None: a run's notice): an alert's startsAt."""


@dataclass(frozen=True)
class Posted:
    """A message lossguard posted in a sink with threads (state layout 8)."""

    id: int
    role: str
    """alert: incidents' own alert; summary: a burst's listing; repeat: the short message that
    stood for a summary whose first post a restart left in doubt."""
    thread: str | None
    """`channel|ts` (None: a summary not known to be posted)."""
    incidents: tuple[IncidentRow, ...]
    """As they stand now: what it announces or lists."""


_SILENCE = "SELECT id, run, rule, metric, cause, starts, ends, comment, author, created, expired, reported FROM silences"
_IN_FORCE = "reported IS NULL AND expired IS NULL AND ends > ?"
"""The silences that may hold something at `?`: the few rows of the `silences_unreported` index,
never the ended ones (a state may keep thousands: SILENCES_KEPT_DAYS)."""
_OVER = "reported IS NULL AND (expired IS NOT NULL OR ends <= ?)"
"""Silences ended and not yet reported (Silence.ended, in SQL)."""
SILENCES_KEPT_DAYS = 30
"""An ended silence, once reported, is kept this long for `silence list --all` (who silenced what,
and why, when a post-mortem asks a few weeks on), then deleted. Nothing else reads it: what it held
was reported when it ended. Alertmanager keeps expired silences for 5 days; a month covers the
review cycles of a training campaign and still bounds the table (a silence a minute from a script
is 43,200 rows, which no round reads)."""


@dataclass(frozen=True)
class PlotRow:
    """A picture to show in one sink, its incident's alert there delivered."""

    incident_id: int
    sink: str
    picture: str
    """plot.Picture as JSON."""
    attempts: int
    thread: str | None
    """`channel|ts` of the incident's Slack thread."""
    alert_key: str
    """The outbox key of the alert it follows (what a JSON-lines reader joins it on)."""


_INCIDENT = "SELECT id, status, body, source, quiet, notified_value, notified_at, top_cause, thread, opened_at FROM incidents"
_OUTBOX = (
    "SELECT o.id, o.incident_id, o.sink, o.kind, o.payload, o.attempts, o.created, i.opened_at "
    "FROM outbox o LEFT JOIN incidents i ON i.id = o.incident_id WHERE o.sent_at IS NULL AND o.permanent=0"
)


_INCIDENT_RUN = _INCIDENT.replace("SELECT id,", "SELECT run, id,", 1)
CHUNK = 500
"""Values bound in one IN (...) list: well under SQLite's limit on a statement's parameters."""


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), CHUNK):
        yield items[i : i + CHUNK]


def _incident_row(r: tuple) -> IncidentRow:
    return IncidentRow(r[0], r[1], Incident.from_json(json.loads(r[2])), r[3], bool(r[4]), r[5], r[6], r[7], r[8], r[9])


def _outbox_entry(r: tuple, state_id: str) -> OutboxEntry:
    return OutboxEntry(r[0], r[1], r[2], Notice.from_json(r[3], json.loads(r[4])), r[5], f"{state_id}-{r[0]}", r[6], r[7])


def _silence(r: tuple) -> Silence:
    return Silence(*r)


def _file_row(r: tuple) -> FileRow:
    return FileRow(_path(r[0]), r[1], r[2], r[3], r[4], r[5] or b"", r[6], bool(r[7]), int(r[8]), r[9])


def _stored(path: str) -> str | bytes:
    """A followed file's path as `files.path` keeps it: text, or (a name that is not UTF-8, which
    Python holds as lone surrogates and SQLite's text cannot) its bytes, as a BLOB: the file must be
    opened again by its real name, and a BLOB never equals a text, so no two paths meet."""
    try:
        path.encode()
    except UnicodeEncodeError:
        return os.fsencode(path)
    return path


def _path(value: str | bytes) -> str:
    """`_stored` undone: the path as os.fsdecode gives it, which opens the file."""
    return os.fsdecode(value) if isinstance(value, bytes) else value


def _unpack_tail(tail: bytes | str, seen: int) -> Tail:
    if isinstance(tail, str):  # version 1: JSON [[step, value], ...], non-finite values as strings
        points = json.loads(tail)
        return Tail(np.array([p[0] for p in points], np.int64), np.array([float(p[1]) for p in points], np.float64), seen)
    step_size, value_size = (np.dtype(t).itemsize for t in TAIL_FORMAT)
    n = len(tail) // (step_size + value_size)
    steps = np.frombuffer(tail, TAIL_FORMAT[0], n).copy()
    return Tail(steps, np.frombuffer(tail, TAIL_FORMAT[1], n, offset=step_size * n).copy(), seen)


def _has_column(db: sqlite3.Connection, statement: str) -> bool:
    words = statement.split()
    if words[:2] != ["ALTER", "TABLE"] or words[3:5] != ["ADD", "COLUMN"]:
        return False
    return any(row[1] == words[5] for row in db.execute(f"PRAGMA table_info({words[2]})"))


TAIL_CACHE = 512
"""Streams whose committed tails stay in memory: a busy run's pass need not decode them again."""


class State:
    def __init__(self, directory: Path, *, log=print) -> None:  # noqa: ANN001
        self.directory = directory
        self._lock: int | None = _claim(directory)
        self.path = directory / "state.db"
        self._tails: OrderedDict[tuple[str, str], Tail] = OrderedDict()
        try:
            try:
                self.db = self._open()
            except sqlite3.DatabaseError as exc:
                if not _damaged(exc):
                    raise StateError(f"{self.path}: cannot use the state file: {exc} ({_WHO})") from None
                self._move_aside(exc, log)
                self.db = self._open()
            self.id, self.fresh = self._identity(log)
        except BaseException:
            self.close()
            raise

    def _move_aside(self, exc: Exception, log) -> None:  # noqa: ANN001
        aside = self.path.with_name(f"state.db.corrupt-{int(time.time())}")
        os.replace(self.path, aside)
        for suffix in ("-wal", "-shm"):
            side = self.path.with_name(self.path.name + suffix)
            if side.exists():
                os.replace(side, aside.with_name(aside.name + suffix))
        log(f"state file {self.path} is damaged ({exc}); moved to {aside}, starting fresh")

    def _identity(self, log) -> tuple[str, bool]:  # noqa: ANN001
        """This state's random id (in every outbox key, so keys never repeat across state files, and
        a sink's idempotency cannot be fooled by a state started over), and whether it is fresh:
        no pass has committed yet. Until one has, whatever the logs hold is history, however often
        the daemon was killed before that (state.db exists from the first second). Opening also
        writes, so a state file this user cannot write is refused at start, not at every pass."""
        meta = dict(self.db.execute("SELECT key, value FROM meta WHERE key IN ('id', 'settled')").fetchall())
        ident = meta.get("id") or uuid.uuid4().hex[:12]
        settled = "settled" in meta
        if not settled and self.db.execute("SELECT EXISTS (SELECT 1 FROM files) OR EXISTS (SELECT 1 FROM incidents)").fetchone()[0]:
            settled = True  # written by a lossguard from before 'settled' was kept: its first pass did commit
        try:
            with self.transaction():
                self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('id', ?)", (ident,))
                self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('opened', ?)", (repr(time.time()),))
                if settled:
                    self.db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('settled', 'legacy')")
        except sqlite3.DatabaseError as exc:
            raise StateError(f"{self.path}: cannot write the state file: {exc} ({_WHO})") from None
        if not settled and "id" in meta:
            log(f"{self.path}: no pass was ever committed (stopped during its first start?): what the logs hold is still history")
        return ident, not settled

    def secondary(self, *, lock_wait: float = 30.0) -> State:
        """The same state on a connection of its own (no lock): the sender delivers and marks
        entries sent while a pass reads and writes; WAL lets them overlap, SQLite serialises commits.
        `lock_wait`: how long a write waits for another writer's lock before StateBusy (the sender
        waits briefly and journals what it could not record, rather than hold its sink up)."""
        return State._attached(self.directory, self.path, self.id, self.fresh, lock_wait=lock_wait)

    @classmethod
    def attach(cls, directory: Path, *, create: bool = False) -> State:
        """The state of a daemon that may be running, for the operator's commands (`outbox`,
        `silence`): no lock held. A missing file is a StateError, or (`create`: a silence set before
        the daemon's first start) a new state. A file of an older layout is brought up to date
        when no daemon holds it (an older daemon that does must be restarted first)."""
        path = directory / "state.db"
        if create and not path.exists():
            cls(directory).close()
        if not path.is_file():
            raise StateError(f"{path}: no state yet (has `lossguard watch` run with this state dir?)")
        try:
            other = cls._attached(directory, path, "", False)
            other.db.execute("SELECT count(*) FROM outbox").fetchone()  # (not ours: refused before anything writes)
            layout = other.db.execute("PRAGMA user_version").fetchone()[0]
            if layout < VERSION:
                other.close()
                try:
                    cls(directory).close()
                except StateLocked:
                    raise StateError(
                        f"{path}: the daemon using it is an older lossguard (state layout {layout}, this one {VERSION}); restart it with this version first"
                    ) from None
                other = cls._attached(directory, path, "", False)
            other.id = dict(other.db.execute("SELECT key, value FROM meta").fetchall()).get("id", "")
        except sqlite3.DatabaseError as exc:
            raise StateError(f"{path}: not a lossguard state file ({exc})") from None
        return other

    @classmethod
    def _attached(cls, directory: Path, path: Path, ident: str, fresh: bool, *, lock_wait: float = 30.0) -> State:
        other = object.__new__(cls)
        other.directory, other.path, other.fresh, other.id, other._lock = directory, path, fresh, ident, None
        other._tails = OrderedDict()
        other.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=lock_wait)
        other.db.execute(f"PRAGMA busy_timeout={int(lock_wait * 1000)}")
        return other

    def _open(self) -> sqlite3.Connection:
        if self.path.is_dir():
            raise StateError(f"{self.path}: the state file is a folder")
        if not self.path.exists():  # private from its first byte (SQLite gives -wal and -shm its mode)
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
        elif self.path.stat().st_size == 0:
            raise _Damaged("the file is empty")
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        db.execute("PRAGMA busy_timeout=30000")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > VERSION:  # before anything writes to it
            db.close()
            raise StateTooNew(
                f"{self.path}: written by a newer lossguard (state layout {version}, this one knows up to {VERSION}); "
                "upgrade lossguard, or give --state-dir a fresh directory"
            )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            db.close()
            raise _Damaged(check)
        empty = db.execute("SELECT count(*) FROM sqlite_master WHERE type='table' AND name='files'").fetchone()[0] == 0
        db.executescript(SCHEMA)
        if version < VERSION:
            db.execute("BEGIN IMMEDIATE")
            try:
                for step in range(version + 1, VERSION + 1) if not empty else ():
                    for statement in MIGRATIONS[step]:
                        if not _has_column(db, statement):
                            db.execute(statement)
                db.execute(f"PRAGMA user_version={VERSION}")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        return db

    def close(self) -> None:
        if getattr(self, "db", None) is not None:
            self.db.close()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """All of a pass's writes, committed at once; the tails it wrote join the cache only then.
        A write lock another writer holds for longer than this connection waits is StateBusy."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in BUSY:
                raise StateBusy(f"{self.path}: the state is locked by another writer ({exc})") from None
            raise
        tx = Transaction(self.db)
        try:
            yield tx
            if tx.touched:
                tx.number_touched()
        except BaseException:
            self.db.execute("ROLLBACK")
            self._tails.clear()
            raise
        self.db.execute("COMMIT")
        for key, tail in tx.tails.items():
            self._tails[key] = tail
            self._tails.move_to_end(key)
        while len(self._tails) > TAIL_CACHE:
            self._tails.popitem(last=False)

    # --- reads ---------------------------------------------------------------------------------
    def files(self, paths: Collection[str] | None = None) -> dict[str, FileRow]:
        """Every followed file, or only those of `paths` (a pass after inotify named what changed)."""
        query = "SELECT path, run, format, device, inode, fingerprint, cursor, dead, quiet, mtime FROM files"
        if paths is None:
            rows = self.db.execute(query).fetchall()
        else:
            wanted = sorted(paths)
            rows = []
            for i in range(0, len(wanted), 500):
                chunk = wanted[i:i + 500]
                rows += self.db.execute(f"{query} WHERE path IN ({','.join('?' * len(chunk))})", [_stored(p) for p in chunk]).fetchall()
        return {_path(r[0]): _file_row(r) for r in rows}

    def tail(self, run: str, key: str) -> Tail:
        """A stream's committed tail (`key`: a canonical metric, or `tag:<tag>` for a context tag)."""
        cached = self._tails.get((run, key))
        if cached is not None:
            self._tails.move_to_end((run, key))
            return cached
        row = self.db.execute("SELECT tail, seen FROM streams WHERE run=? AND metric=?", (run, key)).fetchone()
        return Tail.empty() if not row else _unpack_tail(*row)

    def tails_of(self, runs: Sequence[str], keys: Sequence[str]) -> dict[tuple[str, str], Tail]:
        """`tail` of every (run, key) pair, in one query for those not in memory (a pass over
        hundreds of busy runs); a stream with no tail yet is left out."""
        out: dict[tuple[str, str], Tail] = {}
        missing: list[str] = []
        for run in runs:
            cached = [self._tails.get((run, key)) for key in keys]
            if any(t is None for t in cached):
                missing.append(run)
            out.update(((run, key), t) for key, t in zip(keys, cached) if t is not None)
        marks = ",".join("?" * len(keys))
        for chunk in _chunks(missing):
            rows = self.db.execute(
                f"SELECT run, metric, tail, seen FROM streams WHERE metric IN ({marks}) AND run IN ({','.join('?' * len(chunk))})", (*keys, *chunk)
            )
            for run, key, tail, seen in rows:
                out.setdefault((run, key), _unpack_tail(tail, seen))
        return out

    def incident_keys_of(self, since: Mapping[str, int]) -> dict[str, frozenset[tuple[str, int]]]:
        """`incident_keys` of many runs (run -> since) in one query per 500 runs."""
        found: dict[str, set[tuple[str, int]]] = {}
        for chunk in _chunks(list(since)):
            values = ",".join(["(?,?)"] * len(chunk))
            rows = self.db.execute(
                f"WITH w(run, since) AS (VALUES {values}) SELECT i.run, i.rule, i.step FROM incidents i JOIN w ON i.run = w.run AND i.step >= w.since",
                [x for run in chunk for x in (run, since[run])],
            )
            for run, rule, step in rows:
                found.setdefault(run, set()).add((rule, step))
        return {run: frozenset(keys) for run, keys in found.items()}

    def open_incidents_of(self, runs: Sequence[str]) -> dict[str, list[IncidentRow]]:
        """`open_incidents` of many runs in one query per 500 runs (runs with none left out)."""
        out: dict[str, list[IncidentRow]] = {}
        for chunk in _chunks(runs):
            for r in self.db.execute(f"{_INCIDENT_RUN} WHERE status='open' AND run IN ({','.join('?' * len(chunk))}) ORDER BY id", chunk):
                out.setdefault(r[0], []).append(_incident_row(r[1:]))
        return out

    def runs_of(self, runs: Sequence[str]) -> dict[str, RunRow]:
        """`run` of many runs in one query per 500 runs (runs not known yet left out)."""
        out = {}
        for chunk in _chunks(runs):
            for r in self.db.execute(f"SELECT run, last_step, advanced_at, stalled FROM runs WHERE run IN ({','.join('?' * len(chunk))})", chunk):
                out[r[0]] = RunRow(r[0], r[1], r[2], bool(r[3]))
        return out

    def incident(self, run: str, rule: str, step: int) -> IncidentRow | None:
        row = self.db.execute(f"{_INCIDENT} WHERE run=? AND rule=? AND step=?", (run, rule, step)).fetchone()
        return None if row is None else _incident_row(row)

    def incident_keys(self, run: str, *, since: int) -> frozenset[tuple[str, int]]:
        """(rule, first step) of the run's incidents that start at or after `since`."""
        rows = self.db.execute("SELECT rule, step FROM incidents WHERE run=? AND step>=?", (run, since))
        return frozenset((rule, step) for rule, step in rows)

    def open_incidents(self, run: str) -> list[IncidentRow]:
        return [_incident_row(r) for r in self.db.execute(f"{_INCIDENT} WHERE run=? AND status='open'", (run,))]

    def firing(self) -> tuple[list[IncidentRow], list[RunRow]]:
        """What is wrong right now and was said (not history found at the first start): the open
        incidents and the stalled runs, which a sink whose receiver forgets (Alertmanager) is told
        again and again."""
        incidents = [_incident_row(r) for r in self.db.execute(f"{_INCIDENT} WHERE status='open' AND quiet=0 ORDER BY id")]
        runs = [RunRow(r[0], r[1], r[2], True) for r in self.db.execute("SELECT run, last_step, advanced_at FROM runs WHERE stalled=1 ORDER BY run")]
        return incidents, runs

    def run(self, run: str) -> RunRow | None:
        row = self.db.execute("SELECT run, last_step, advanced_at, stalled FROM runs WHERE run=?", (run,)).fetchone()
        return None if row is None else RunRow(row[0], row[1], row[2], bool(row[3]))

    def runs(self) -> list[RunRow]:
        return [RunRow(r[0], r[1], r[2], bool(r[3])) for r in self.db.execute("SELECT run, last_step, advanced_at, stalled FROM runs")]

    def pending(self, limit: int = 100, *, sink: str | None = None, kind: str | None = None) -> list[OutboxEntry]:
        """Undelivered entries, oldest first (permanently failed ones wait for the operator)."""
        query, args = _OUTBOX, []
        if sink is not None:
            query, args = query + " AND o.sink=?", [sink]
        if kind is not None:
            query, args = query + " AND o.kind=?", [*args, kind]
        return [_outbox_entry(r, self.id) for r in self.db.execute(f"{query} ORDER BY o.id LIMIT ?", (*args, limit))]

    def pending_sinks(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT sink FROM outbox WHERE sent_at IS NULL AND permanent=0 ORDER BY sink")]

    def thread(self, incident_id: int) -> str | None:
        """The Slack message the incident's notices reply to: its own, else (an escalation not yet
        posted) the thread of the incident it escalates."""
        row = self.db.execute(
            "SELECT coalesce(i.thread, p.thread) FROM incidents i LEFT JOIN incidents p ON p.id = i.parent WHERE i.id=?", (incident_id,)
        ).fetchone()
        return row[0] if row else None

    def alert_message(self, incident_id: int, sink: str) -> Posted | None:
        """The incident's own alert in `sink` (or, an escalation, the alert of the incident it
        escalates), with every incident it announces: those it was posted for and the escalations
        that joined it."""
        row = self.db.execute(
            "SELECT m.id, m.role, m.channel, m.ts FROM messages m JOIN message_incidents mi ON mi.message = m.id "
            "WHERE m.sink=? AND m.role='alert' AND mi.incident_id IN (SELECT id FROM incidents WHERE id=? UNION SELECT parent FROM incidents WHERE id=?) "
            "ORDER BY m.id LIMIT 1", (sink, incident_id, incident_id),
        ).fetchone()
        return None if row is None else self._posted(row)

    def summary_of(self, incident_id: int, sink: str) -> Posted | None:
        """The burst summary in `sink` that lists the incident (posted: its ts known)."""
        row = self.db.execute(
            "SELECT m.id, m.role, m.channel, m.ts FROM messages m JOIN message_incidents mi ON mi.message = m.id "
            "WHERE m.sink=? AND m.role IN ('summary', 'repeat') AND m.ts IS NOT NULL AND mi.incident_id=? ORDER BY m.id DESC LIMIT 1",
            (sink, incident_id),
        ).fetchone()
        return None if row is None else self._posted(row)

    def summaries_in_doubt(self, sink: str) -> dict[int, int]:
        """incident -> the summary listing it whose post a restart interrupted (no ts recorded)."""
        rows = self.db.execute(
            "SELECT mi.incident_id, m.id FROM messages m JOIN message_incidents mi ON mi.message = m.id WHERE m.sink=? AND m.ts IS NULL", (sink,)
        )
        return dict(rows.fetchall())

    def _posted(self, row: tuple) -> Posted:
        query = f"{_INCIDENT} WHERE id IN (SELECT incident_id FROM message_incidents WHERE message=?) ORDER BY id"
        incidents = tuple(_incident_row(r) for r in self.db.execute(query, (row[0],)))
        return Posted(row[0], row[1], f"{row[2]}|{row[3]}" if row[3] else None, incidents)

    def due_plots(self, limit: int) -> list[PlotRow]:
        """Pictures not yet shown whose incident's alert (opened or escalated, or the report of it
        when a silence held it back) went out to their sink."""
        rows = self.db.execute(
            "SELECT p.incident_id, p.sink, p.picture, p.attempts, i.thread, o.id FROM plots p "
            "JOIN incidents i ON i.id = p.incident_id "
            "JOIN outbox o ON o.id = (SELECT min(id) FROM outbox WHERE incident_id = p.incident_id AND sink = p.sink "
            "AND kind IN ('opened', 'escalated', 'unsilenced') AND sent_at IS NOT NULL AND silenced IS NULL) "
            "WHERE p.done_at IS NULL ORDER BY p.incident_id, p.sink LIMIT ?", (limit,),
        ).fetchall()
        return [PlotRow(r[0], r[1], r[2], r[3], r[4], f"{self.id}-{r[5]}") for r in rows]

    def plot_done(self, incident_id: int, sink: str | None, *, now: float, error: str | None = None) -> None:
        """Shown (or, with `error`, given up): never tried again; the curves are dropped (the PNG
        stays under the state directory). `sink` None: for every sink (the picture cannot be drawn)."""
        with self.transaction():
            query = "UPDATE plots SET done_at=?, error=?, picture='', attempts=attempts+1 WHERE incident_id=? AND done_at IS NULL"
            if sink is None:
                self.db.execute(query, (now, error, incident_id))
            else:
                self.db.execute(query + " AND sink=?", (now, error, incident_id, sink))

    def plot_failed(self, incident_id: int, sink: str, error: str) -> None:
        with self.transaction():
            self.db.execute("UPDATE plots SET attempts=attempts+1, error=? WHERE incident_id=? AND sink=?", (error, incident_id, sink))

    # --- delivery's writes (each its own transaction: the sender runs beside the passes) ---------
    def mark_sent(self, entries: Sequence[OutboxEntry], *, now: float, thread: str | None = None, alert_in: str | None = None,
                  joins: int | None = None) -> None:
        """Delivered: never sent again. `thread`: the message their incidents' follow-ups reply to;
        `alert_in`: the sink in which that message is their incidents' own alert (posted at the top
        of a channel: the one message a resolution may rewrite); `joins`: an alert posted before
        that now announces their incidents too (an escalation's, whose header it rewrote)."""
        with self.transaction():
            # (Idempotent: a delivery journal replayed after a kill that came before it was removed
            # makes the same rows, not a second message row or attempt.)
            for e in entries:
                self.db.execute("UPDATE outbox SET sent_at=?, attempts=attempts+1 WHERE id=? AND sent_at IS NULL", (now, e.id))
                if thread and e.incident_id is not None:
                    self.db.execute("UPDATE incidents SET thread=? WHERE id=?", (thread, e.incident_id))
            if alert_in is not None and thread:
                channel, _, ts = thread.partition("|")
                known = self.db.execute("SELECT id FROM messages WHERE sink=? AND channel=? AND ts=? AND role='alert'", (alert_in, channel, ts)).fetchone()
                message = known[0] if known else self.db.execute(
                    "INSERT INTO messages (sink, role, channel, ts, created) VALUES (?, 'alert', ?, ?, ?)", (alert_in, channel, ts, now)
                ).lastrowid
                self._list_in(message, entries)
            if joins is not None:
                self._list_in(joins, entries)

    def set_thread(self, entries: Sequence[OutboxEntry], thread: str, *, message: int | None = None, repeat: bool = False) -> None:
        """The message the entries' incidents reply in (a summary listing them), before they are
        sent. `message`: the summary's row (`intend_summary`), whose channel and ts are known now;
        `repeat`: the post was the short one that stands for a summary in doubt."""
        with self.transaction():
            for e in entries:
                if e.incident_id is not None:
                    self.db.execute("UPDATE incidents SET thread=? WHERE id=?", (thread, e.incident_id))
            if message is not None:
                channel, _, ts = thread.partition("|")
                role = "repeat" if repeat else "summary"
                self.db.execute("UPDATE messages SET channel=?, ts=?, role=? WHERE id=?", (channel, ts, role, message))

    def intend_summary(self, sink: str, entries: Sequence[OutboxEntry], *, now: float) -> int:
        """A burst's summary about to be sent to `sink`, listing the entries' incidents: written
        before the post, so a restart that finds it without a ts knows it may have gone out."""
        with self.transaction():
            message = int(self.db.execute("INSERT INTO messages (sink, role, created) VALUES (?, 'summary', ?)", (sink, now)).lastrowid)
            self._list_in(message, entries)
        return message

    def forget_message(self, message: int) -> None:
        """A summary whose post was refused: it did not go out."""
        with self.transaction():
            self.db.execute("DELETE FROM message_incidents WHERE message=?", (message,))
            self.db.execute("DELETE FROM messages WHERE id=?", (message,))

    def _list_in(self, message: int, entries: Sequence[OutboxEntry]) -> None:
        self.db.executemany(
            "INSERT OR IGNORE INTO message_incidents (message, incident_id) VALUES (?,?)",
            [(message, e.incident_id) for e in entries if e.incident_id is not None],
        )

    def mark_failed(self, entries: Sequence[OutboxEntry], error: str, *, permanent: bool) -> None:
        with self.transaction():
            for e in entries:
                self.db.execute("UPDATE outbox SET attempts=attempts+1, last_error=?, permanent=? WHERE id=?", (error, int(permanent), e.id))

    # --- the operator's hand on the outbox (`lossguard outbox`, and every start or reload) --------
    def undelivered(self, ids: Collection[int] | None = None) -> list[Undelivered]:
        """Entries not delivered, oldest first, with why (all, or those of `ids`)."""
        query = "SELECT id, sink, kind, payload, created, attempts, last_error, permanent FROM outbox WHERE sent_at IS NULL"
        rows = self.db.execute(f"{query} ORDER BY id").fetchall()
        wanted = None if ids is None else set(ids)
        return [
            Undelivered(r[0], r[1], r[2], json.loads(r[3]).get("run", ""), r[4], r[5], r[6], bool(r[7]))
            for r in rows if wanted is None or r[0] in wanted
        ]

    def retry(self, ids: Collection[int] | None = None) -> int:
        """Permanently failed entries (all, or those of `ids`) go back in line. The fix for such a
        failure is nearly always the operator's (a token, a channel, a URL), so the daemon retries
        them at every start and reload, and `lossguard outbox retry` at once."""
        with self.transaction():
            if ids is None:
                return self.db.execute("UPDATE outbox SET permanent=0 WHERE sent_at IS NULL AND permanent=1").rowcount
            return sum(self.db.execute("UPDATE outbox SET permanent=0 WHERE id=? AND sent_at IS NULL AND permanent=1", (i,)).rowcount for i in ids)

    def drop(self, ids: Collection[int] | None = None) -> int:
        """Entries the operator gave up on: deleted, never sent (all undelivered, or those of `ids`)."""
        with self.transaction():
            if ids is None:
                n = self.db.execute("DELETE FROM outbox WHERE sent_at IS NULL").rowcount
            else:
                n = sum(self.db.execute("DELETE FROM outbox WHERE id=? AND sent_at IS NULL", (i,)).rowcount for i in ids)
            # A picture whose alert was given up would wait for it forever.
            self.db.execute(
                "DELETE FROM plots WHERE done_at IS NULL AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.incident_id = plots.incident_id "
                "AND o.sink = plots.sink AND o.kind IN ('opened', 'escalated', 'unsilenced'))"
            )
            return n

    # --- silences (`lossguard silence`; the sender honours them at every round) -----------------
    def silences(self, *, now: float | None = None) -> list[Silence]:
        """Every silence kept, oldest first; with `now`, only those in force (not ended by then,
        and not expired or reported, whatever the clock says): read through an index at every
        round, so the ended ones a state keeps cost the sender nothing."""
        return _silences(self.db, now=now)

    def ended_silences(self, *, now: float, limit: int | None = None) -> tuple[list[Silence], int]:
        """The silences kept that are not in force at `now`: the `limit` added last (None: every
        one), oldest first, and how many are kept (`silence list --all`: the table read backwards
        from its newest row, however many it keeps)."""
        ended = f"NOT ({_IN_FORCE})"
        total = self.db.execute(f"SELECT count(*) FROM silences WHERE {ended}", (now,)).fetchone()[0]
        rows = self.db.execute(f"{_SILENCE} WHERE {ended} ORDER BY id DESC LIMIT ?", (now, -1 if limit is None else limit)).fetchall()
        return [_silence(r) for r in reversed(rows)], total

    def add_silence(self, *, run: str, rule: str | None, metric: str | None, cause: str | None, starts: float, ends: float,
                    comment: str, author: str) -> Silence:
        with self.transaction():
            cur = self.db.execute(
                "INSERT INTO silences (run, rule, metric, cause, starts, ends, comment, author, created) VALUES (?,?,?,?,?,?,?,?,?)",
                (run, rule, metric, cause, starts, ends, comment, author, starts),
            )
            self._prune_silences(starts)
        return _silence(self.db.execute(f"{_SILENCE} WHERE id=?", (cur.lastrowid,)).fetchone())

    def expire_silence(self, ident: int, *, now: float) -> Silence | None:
        """Ends a silence now (None: no such silence). One already over stays as it was."""
        with self.transaction():
            self.db.execute("UPDATE silences SET expired=? WHERE id=? AND expired IS NULL AND reported IS NULL AND ends > ?", (now, ident, now))
        row = self.db.execute(f"{_SILENCE} WHERE id=?", (ident,)).fetchone()
        return None if row is None else _silence(row)

    def announced(self, entry: OutboxEntry) -> bool:
        """Whether what `entry` follows up went out to its sink, not held by a silence: its
        incident's alert (opened, escalated, or reported as a silence ended), or for a run's notice
        the last stall said of the run before it."""
        if entry.incident_id is not None:
            return self.db.execute(
                "SELECT EXISTS (SELECT 1 FROM outbox WHERE incident_id=? AND sink=? AND kind IN ('opened', 'escalated', 'unsilenced') "
                "AND sent_at IS NOT NULL AND silenced IS NULL)", (entry.incident_id, entry.sink),
            ).fetchone()[0] == 1
        row = self.db.execute(
            "SELECT sent_at IS NOT NULL AND silenced IS NULL FROM outbox WHERE incident_id IS NULL AND sink=? AND id < ? "
            "AND kind IN ('stalled', 'unsilenced') AND json_extract(payload, '$.run')=? ORDER BY id DESC LIMIT 1",
            (entry.sink, entry.id, entry.notice.run),
        ).fetchone()
        return bool(row and row[0])

    def hold(self, entries: Sequence[OutboxEntry], silence: Silence, *, now: float) -> bool:
        """Entries a silence covers: settled without being sent, and remembered as held by it.
        False (nothing held) when the silence's end was reported meanwhile (another sink's sender,
        after this one read the silences): what it held then would never be reported."""
        with self.transaction():
            if self.db.execute("SELECT reported IS NULL FROM silences WHERE id=?", (silence.id,)).fetchone() != (1,):
                return False
            for e in entries:
                self.db.execute("UPDATE outbox SET sent_at=?, silenced=? WHERE id=? AND sent_at IS NULL", (now, silence.id, e.id))
        return True

    def end_silences(self, now: float) -> int:
        """Silences that ended since the last look: what they held back and is still wrong (an
        incident still open, a run still stalled) is reported once, to each sink it was held from,
        unless another silence still covers it (then that one holds it). One transaction: a
        crash reports it exactly once, at the next start. Returns the notices queued."""
        queued = 0
        if not self.db.execute(f"SELECT EXISTS (SELECT 1 FROM silences WHERE {_OVER})", (now,)).fetchone()[0]:
            return 0  # (the common case, every round: no write lock taken, only the index read)
        with self.transaction() as tx:
            silences = [_silence(r) for r in self.db.execute(f"{_SILENCE} WHERE reported IS NULL").fetchall()]
            ended = [s for s in silences if s.ended(now)]
            others = [s for s in silences if s.active(now)]
            for s in ended:
                for notice, incident_id, sink in self._held_still_wrong(s):
                    other = covering(others, notice, now)
                    if other is not None:
                        self.db.execute(
                            "UPDATE outbox SET silenced=? WHERE silenced=? AND sink=? AND incident_id IS ? AND json_extract(payload, '$.run')=?",
                            (other.id, s.id, sink, incident_id, notice.run),
                        )
                        continue
                    tx.enqueue(replace(notice, silenced_by=s.describe()), incident_id=incident_id, sinks=[sink], now=now)
                    queued += 1
                # A picture whose alert the silence held, of an incident that recovered under it,
                # has no alert left to follow.
                self.db.execute(
                    "UPDATE plots SET done_at=?, error='its alert was held by a silence', picture='' WHERE done_at IS NULL AND incident_id IN "
                    "(SELECT o.incident_id FROM outbox o JOIN incidents i ON i.id = o.incident_id WHERE o.silenced=? AND i.status != 'open') "
                    "AND NOT EXISTS (SELECT 1 FROM outbox o2 WHERE o2.incident_id = plots.incident_id AND o2.sink = plots.sink "
                    "AND o2.kind IN ('opened', 'escalated', 'unsilenced') AND o2.silenced IS NULL)", (now, s.id),
                )
                self.db.execute("UPDATE silences SET reported=? WHERE id=?", (now, s.id))
            self._prune_silences(now)
        return queued

    def _prune_silences(self, now: float) -> None:
        """Silences ended and reported more than SILENCES_KEPT_DAYS ago are deleted (in the write of
        a silence added or ended: no timer of its own). The newest row always stays, so that SQLite
        never gives its id to a new silence: entries it held still name it (`outbox.silenced`)."""
        self.db.execute(
            "DELETE FROM silences WHERE reported IS NOT NULL AND min(ends, coalesce(expired, ends)) < ? AND id < (SELECT max(id) FROM silences)",
            (now - SILENCES_KEPT_DAYS * 86400,),
        )

    def _held_still_wrong(self, silence: Silence) -> list[tuple[Notice, int | None, str]]:
        """(the notice to report, its incident, the sink) for what `silence` held back and is still
        wrong: each open incident once per sink (as it stands now), each still-stalled run once."""
        out: list[tuple[Notice, int | None, str]] = []
        rows = self.db.execute(
            "SELECT DISTINCT o.incident_id, o.sink FROM outbox o JOIN incidents i ON i.id = o.incident_id "
            "WHERE o.silenced=? AND i.status='open' ORDER BY o.incident_id, o.sink", (silence.id,)
        ).fetchall()
        for incident_id, sink in rows:
            row = _incident_row(self.db.execute(f"{_INCIDENT} WHERE id=?", (incident_id,)).fetchone())
            out.append((Notice("unsilenced", row.incident.run, row.incident, source=row.source), incident_id, sink))
        stalled = self.db.execute(
            "SELECT DISTINCT o.sink, r.run, r.last_step FROM outbox o JOIN runs r ON r.run = json_extract(o.payload, '$.run') "
            "WHERE o.silenced=? AND o.incident_id IS NULL AND o.kind='stalled' AND r.stalled=1 ORDER BY r.run, o.sink", (silence.id,)
        ).fetchall()
        for sink, run, step in stalled:
            out.append((Notice("unsilenced", run, step=step), None, sink))
        return out


@dataclass(frozen=True)
class Undelivered:
    """An outbox entry as the operator sees it."""

    id: int
    sink: str
    kind: str
    run: str
    created: float
    attempts: int
    error: str | None
    permanent: bool


@dataclass
class Transaction:
    """A pass's writes, typed: the only place the daemon's rows are written."""

    db: sqlite3.Connection
    tails: dict[tuple[str, str], Tail] = field(default_factory=dict)
    touched: set[str] = field(default_factory=set)
    """Runs whose metrics (latest values, step, stall, incidents) this transaction changed."""

    def number_touched(self) -> None:
        """This commit's number, on every run it changed: what a scrape renders again."""
        self.db.execute("INSERT INTO meta (key, value) VALUES ('touched', 1) ON CONFLICT (key) DO UPDATE SET value = value + 1")
        runs = sorted(self.touched)
        for i in range(0, len(runs), 500):
            chunk = runs[i:i + 500]
            self.db.execute(
                f"UPDATE runs SET touched = (SELECT value FROM meta WHERE key='touched') WHERE run IN ({','.join('?' * len(chunk))})", chunk
            )

    def put_file(self, f: FileRow) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO files (path, run, format, device, inode, fingerprint, cursor, dead, quiet, mtime) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (_stored(f.path), f.run, f.format, f.device, f.inode, f.fingerprint, f.cursor, int(f.dead), int(f.quiet), f.mtime),
        )

    def forget_file(self, path: str) -> None:
        self.db.execute("DELETE FROM files WHERE path=?", (_stored(path),))

    def put_tail(self, run: str, key: str, tail: Tail) -> None:
        # Packed, not JSON: the daemon writes every busy stream's tail (up to 400 points) each pass.
        packed = np.ascontiguousarray(tail.steps, TAIL_FORMAT[0]).tobytes() + np.ascontiguousarray(tail.values, TAIL_FORMAT[1]).tobytes()
        self.db.execute("INSERT OR REPLACE INTO streams (run, metric, tail, seen) VALUES (?,?,?,?)", (run, key, packed, tail.seen))
        if tail.values.size:  # the latest value on its own: a scrape reads it without the tail
            self.db.execute("INSERT OR REPLACE INTO latest (run, metric, value) VALUES (?,?,?)", (run, key, packed[-8:]))
            self.touched.add(run)
        self.tails[(run, key)] = tail

    def put_tails(self, tails: Sequence[tuple[str, str, Tail]]) -> None:
        """`put_tail` of many streams, in two statements (a pass over hundreds of busy runs)."""
        rows, latest = [], []
        for run, key, tail in tails:
            packed = np.ascontiguousarray(tail.steps, TAIL_FORMAT[0]).tobytes() + np.ascontiguousarray(tail.values, TAIL_FORMAT[1]).tobytes()
            rows.append((run, key, packed, tail.seen))
            if tail.values.size:
                latest.append((run, key, packed[-8:]))
                self.touched.add(run)
            self.tails[(run, key)] = tail
        self.db.executemany("INSERT OR REPLACE INTO streams (run, metric, tail, seen) VALUES (?,?,?,?)", rows)
        self.db.executemany("INSERT OR REPLACE INTO latest (run, metric, value) VALUES (?,?,?)", latest)

    def advance_runs(self, runs: Sequence[tuple[str, int]], *, now: float) -> None:
        """`advance_run` of many runs (run, last step) in one statement."""
        self.db.executemany("INSERT OR REPLACE INTO runs (run, last_step, advanced_at, stalled) VALUES (?,?,?,0)", [(run, step, now) for run, step in runs])
        self.touched.update(run for run, _ in runs)

    def add_incident(self, incident: Incident, *, source: str, quiet: bool, now: float, parent: int | None = None) -> int:
        """`parent`: the incident this one escalates (its alert thread is this one's too)."""
        status = "resolved" if incident.over else "open"
        top = incident.causes[0].cause if incident.causes else None
        cur = self.db.execute(
            "INSERT INTO incidents (run, rule, step, status, body, source, quiet, notified_value, notified_at, top_cause, parent, opened_at) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (incident.run, incident.rule, incident.step, status, json.dumps(incident.to_json()), source, int(quiet), incident.value, now, top, parent, now),
        )
        self.touched.add(incident.run)
        return int(cur.lastrowid)

    def update_incident(self, row: IncidentRow) -> None:
        """The incident as now judged, and what was last announced about it."""
        status = "resolved" if row.incident.over else "open"
        top = row.incident.causes[0].cause if row.incident.causes else None
        self.db.execute(
            "UPDATE incidents SET status=?, body=?, source=?, top_cause=?, notified_value=?, notified_at=? WHERE id=?",
            (status, json.dumps(row.incident.to_json()), row.source, top, row.notified_value, row.notified_at, row.id),
        )
        self.touched.add(row.incident.run)

    def enqueue(self, notice: Notice, *, incident_id: int | None, sinks: Sequence[str], now: float) -> None:
        payload = json.dumps(notice.to_json())
        for sink in sinks:
            self.db.execute(
                "INSERT INTO outbox (incident_id, sink, kind, payload, created) VALUES (?,?,?,?,?)", (incident_id, sink, notice.kind, payload, now)
            )

    def add_plot(self, incident_id: int, picture: str, *, sinks: Sequence[str], now: float) -> None:
        """The incident's picture, to show in `sinks` once its alert went out there."""
        for sink in sinks:
            self.db.execute(
                "INSERT OR IGNORE INTO plots (incident_id, sink, picture, created) VALUES (?,?,?,?)", (incident_id, sink, picture, now)
            )

    def advance_run(self, run: str, last_step: int, *, now: float) -> None:
        self.db.execute("INSERT OR REPLACE INTO runs (run, last_step, advanced_at, stalled) VALUES (?,?,?,0)", (run, last_step, now))
        self.touched.add(run)

    def mark_stalled(self, run: str) -> None:
        self.db.execute("UPDATE runs SET stalled=1 WHERE run=?", (run,))
        self.touched.add(run)

    def settle(self) -> None:
        """The first pass commits: from now on what the logs hold beyond their offsets is news."""
        self.db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('settled', ?)", (repr(time.time()),))


@dataclass(frozen=True)
class Backlog:
    """Undelivered outbox entries (permanent failures too: they wait for the operator)."""

    pending: int
    oldest_created: float | None


class StateReader:
    """The state read-only on a connection of its own, for what the metrics show at scrape time: in
    WAL mode a reader never waits for a pass's writes nor holds them up, so a scrape cannot delay an
    alert. Queries are serialised here (several scrapes may come at once)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            self.db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, check_same_thread=False, timeout=5)
            self.db.execute("PRAGMA busy_timeout=5000")
        except sqlite3.DatabaseError as exc:
            raise StateError(f"{path}: cannot open the state file to read ({exc})") from None

    def _all(self, query: str, args: Sequence[object] = ()) -> list[tuple]:
        with self._lock:
            try:
                return self.db.execute(query, args).fetchall()
            except sqlite3.DatabaseError as exc:
                raise StateError(f"{self.path}: cannot read the state file ({exc})") from None

    def data_version(self) -> int:
        """Changes whenever another connection (a pass, the sender) commits: what to render anew."""
        return self._all("PRAGMA data_version")[0][0]

    def live_runs(self, *, since: float) -> list[RunRow]:
        """Runs that logged a new step at or after `since` (older ones are left out: bounded)."""
        rows = self._all("SELECT run, last_step, advanced_at, stalled FROM runs WHERE advanced_at >= ? ORDER BY run", (since,))
        return [RunRow(r[0], r[1], r[2], bool(r[3])) for r in rows]

    def touched(self, since: int) -> tuple[int, set[str]]:
        """The number of the last commit that changed a run's metrics, and the runs changed by
        commits after `since` (read before their data: a commit in between is seen again later)."""
        row = self._all("SELECT value FROM meta WHERE key='touched'")
        last = int(row[0][0]) if row else 0
        return last, {r[0] for r in self._all("SELECT run FROM runs WHERE touched > ?", (since,))} if last > since else set()

    def _by_run(self, query: str, args: Sequence[object], runs: Collection[str] | None, group: str = "") -> list[tuple]:
        """`query` (ending in a WHERE clause) over every run, or over `runs` only (in chunks)."""
        if runs is None:
            return self._all(query.replace(" AND {runs}", "") + group, args)
        wanted, out = sorted(runs), []
        for i in range(0, len(wanted), 500):
            chunk = wanted[i:i + 500]
            out += self._all(query.replace("{runs}", f"run IN ({','.join('?' * len(chunk))})") + group, (*args, *chunk))
        return out

    def latest_values(self, metrics: Sequence[str], runs: Collection[str] | None = None) -> dict[tuple[str, str], float]:
        """(run, metric) -> the last value of its stream, from the small `latest` table (a busy box
        scraped every 15 s: reading 4,000 tails of up to 400 points cost 14 ms a scrape); of every
        run, or of `runs`. (Layout 7 filled it for streams not written since layout 6.)"""
        marks = ",".join("?" * len(metrics))
        unpack = struct.Struct(TAIL_FORMAT[1].replace("<f8", "<d")).unpack  # (a scrape reads thousands)
        rows = self._by_run(f"SELECT run, metric, value FROM latest WHERE metric IN ({marks}) AND {{runs}}", metrics, runs)
        return {(run, metric): unpack(last)[0] for run, metric, last in rows}

    def open_incidents_by_severity(self, runs: Collection[str] | None = None) -> dict[tuple[str, str], int]:
        rows = self._by_run("SELECT run, coalesce(json_extract(body, '$.severity'), ''), count(*) FROM incidents WHERE status='open' AND {runs}", (), runs, " GROUP BY 1, 2")
        return {(run, severity): n for run, severity, n in rows}

    def incidents_by_rule(self, runs: Collection[str] | None = None) -> dict[tuple[str, str], int]:
        """Incidents ever raised per run and rule (history found at the first start included)."""
        return {(run, rule): n for run, rule, n in self._by_run("SELECT run, rule, count(*) FROM incidents WHERE 1 AND {runs}", (), runs, " GROUP BY run, rule")}

    def backlog(self) -> Backlog:
        n, oldest = self._all("SELECT count(*), min(created) FROM outbox WHERE sent_at IS NULL")[0]
        return Backlog(n, oldest)

    def files_followed(self) -> int:
        return self._all("SELECT count(*) FROM files WHERE dead=0")[0][0]

    def size_bytes(self) -> int:
        """state.db and its write-ahead log: together, what the state takes on disk."""
        total = 0
        for name in (self.path.name, self.path.name + "-wal"):
            try:
                total += (self.path.parent / name).stat().st_size
            except OSError:
                pass
        return total

    def close(self) -> None:
        self.db.close()


T = TypeVar("T")


def _read_only(path: Path, read: Callable[[sqlite3.Connection], T]) -> T:
    """`read` on the state file opened read-only (safe while the daemon runs); a file that is no
    state is a StateError naming it."""
    if path.is_dir():
        raise StateError(f"{path}: the state file is a folder")
    try:
        db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=10)
    except sqlite3.DatabaseError as exc:
        raise StateError(f"{path}: cannot open the state file ({exc})") from None
    try:
        return read(db)
    except sqlite3.DatabaseError as exc:
        raise StateError(f"{path}: not a lossguard state file ({exc})") from None
    finally:
        db.close()


def read_summary(path: Path) -> dict[str, list[dict[str, object]]]:
    """What `lossguard status` shows."""
    return _read_only(path, _summary)


def _summary(db: sqlite3.Connection) -> dict[str, list[dict[str, object]]]:
    from ..ingest.cursor import Cursor

    q = db.execute
    return {
        "files": [
            {"path": decodable(_path(p)), "run": r, "format": f, "offset": Cursor.from_json(c).offset, "dead": bool(d)}
            for p, r, f, c, d in q("SELECT path, run, format, cursor, dead FROM files ORDER BY path")
        ],
        "open_incidents": [{"run": r, "rule": ru, "step": st} for r, ru, st in q("SELECT run, rule, step FROM incidents WHERE status='open' ORDER BY run, step")],
        "undelivered": [
            {"id": i, "kind": k, "attempts": a, "error": e, "permanent": bool(p)}
            for i, k, a, e, p in q("SELECT id, kind, attempts, last_error, permanent FROM outbox WHERE sent_at IS NULL ORDER BY id")
        ],
        "silences": [s.to_json() for s in _silences(db, now=time.time())],
    }


def _silences(db: sqlite3.Connection, *, now: float | None) -> list[Silence]:
    """Silences in force at `now` (None: every one kept), oldest first; none in a state from before
    layout 7, which had none. (Sorted here: an ORDER BY would have SQLite walk the whole table in
    id order instead of the index of the few unreported ones.)"""
    if not db.execute("SELECT count(*) FROM sqlite_master WHERE type='table' AND name='silences'").fetchone()[0]:
        return []
    if now is None:
        return [_silence(r) for r in db.execute(f"{_SILENCE} ORDER BY id")]
    return sorted(map(_silence, db.execute(f"{_SILENCE} WHERE {_IN_FORCE}", (now,))), key=lambda s: s.id)


def read_silences(path: Path, *, now: float) -> list[Silence]:
    """The silences in force (`scan --slack-digest` leaves out what they cover)."""
    return _read_only(path, lambda db: _silences(db, now=now))
