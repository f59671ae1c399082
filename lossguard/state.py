"""The daemon's memory, in one SQLite file (WAL): what it follows and how far it read, the tail of
each stream that the windows continue from, the incidents it raised, and an outbox of notifications
not yet delivered. A pass's offsets, incidents and outbox entries are committed in one transaction,
so after a crash the daemon resumes exactly where its last commit left it: nothing raised twice,
nothing lost."""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import LossguardError

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
CREATE TABLE IF NOT EXISTS runs (
    run TEXT PRIMARY KEY, last_step INTEGER, advanced_at REAL, stalled INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS incidents (
    id INTEGER PRIMARY KEY, run TEXT NOT NULL, rule TEXT NOT NULL, step INTEGER NOT NULL,
    status TEXT NOT NULL, body TEXT NOT NULL, quiet INTEGER NOT NULL DEFAULT 0,
    notified_value REAL, notified_at REAL, top_cause TEXT, thread TEXT,
    UNIQUE (run, rule, step)
);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY, incident_id INTEGER, kind TEXT NOT NULL, payload TEXT NOT NULL,
    created REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, permanent INTEGER NOT NULL DEFAULT 0,
    sent_at REAL
);
"""


VERSION = 2
"""The layout of state.db, kept in SQLite's user_version. A later layout adds a step to MIGRATIONS
(the statements that take version N - 1 to N), run in one transaction when an older file is opened.
Version 0 is a file from before versions were kept: its layout is version 1's. Version 2 writes
stream tails as packed numbers (TAIL_FORMAT) instead of JSON; version 1's JSON tails are still read,
and an older lossguard refuses a version 2 file rather than misread it."""
MIGRATIONS: dict[int, tuple[str, ...]] = {1: (), 2: ()}
TAIL_FORMAT = ("<i8", "<f8")
"""A tail on disk: its steps (int64), then its values (float64, NaN and infinities as they are)."""


class StateLocked(LossguardError):
    """Another lossguard daemon holds this state directory."""


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


class State:
    def __init__(self, directory: Path, *, log=print) -> None:  # noqa: ANN001
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = open(directory / "lossguard.lock", "a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise StateLocked(f"{directory}: another lossguard daemon is using this state directory") from None
        self.path = directory / "state.db"
        self.fresh = not self.path.exists()
        try:
            self.db = self._open()
        except StateTooNew:
            self._lock.close()
            raise
        except sqlite3.DatabaseError as exc:
            aside = self.path.with_name(f"state.db.corrupt-{int(time.time())}")
            os.replace(self.path, aside)
            for suffix in ("-wal", "-shm"):
                side = self.path.with_name(self.path.name + suffix)
                if side.exists():
                    os.replace(side, aside.with_name(aside.name + suffix))
            log(f"error: state file {self.path} is damaged ({exc}); moved to {aside}, starting fresh")
            self.fresh = True
            self.db = self._open()

    def secondary(self) -> State:
        """The same state on a connection of its own (no lock file): the sender delivers and marks
        entries sent while a pass reads and writes; WAL lets them overlap, SQLite serialises commits."""
        other = object.__new__(State)
        other.directory, other.path, other.fresh, other._lock = self.directory, self.path, self.fresh, None
        other.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        other.db.execute("PRAGMA busy_timeout=30000")
        return other

    def _open(self) -> sqlite3.Connection:
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
            raise sqlite3.DatabaseError(check)
        db.executescript(SCHEMA)
        if version < VERSION:
            db.execute("BEGIN IMMEDIATE")
            try:
                for step in range(version + 1, VERSION + 1):
                    for statement in MIGRATIONS[step]:
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={VERSION}")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        return db

    def close(self) -> None:
        self.db.close()
        if self._lock is not None:
            self._lock.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # --- files -------------------------------------------------------------------------------
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
                rows += self.db.execute(f"{query} WHERE path IN ({','.join('?' * len(chunk))})", chunk).fetchall()
        return {r[0]: FileRow(r[0], r[1], r[2], r[3], r[4], r[5] or b"", r[6], bool(r[7]), int(r[8]), r[9]) for r in rows}

    @staticmethod
    def put_file(db: sqlite3.Connection, f: FileRow) -> None:
        db.execute(
            "INSERT OR REPLACE INTO files (path, run, format, device, inode, fingerprint, cursor, dead, quiet, mtime) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (f.path, f.run, f.format, f.device, f.inode, f.fingerprint, f.cursor, int(f.dead), int(f.quiet), f.mtime),
        )

    # --- streams -----------------------------------------------------------------------------
    def stream(self, run: str, metric: str) -> tuple[np.ndarray, np.ndarray, int]:
        """A stream's tail as (steps, values) and how many points it has seen."""
        row = self.db.execute("SELECT tail, seen FROM streams WHERE run=? AND metric=?", (run, metric)).fetchone()
        if not row:
            return np.empty(0, np.int64), np.empty(0, np.float64), 0
        tail, seen = row
        if isinstance(tail, str):  # version 1: JSON [[step, value], ...], non-finite values as strings
            points = json.loads(tail)
            return np.array([p[0] for p in points], np.int64), np.array([float(p[1]) for p in points], np.float64), seen
        step_size, value_size = (np.dtype(t).itemsize for t in TAIL_FORMAT)
        n = len(tail) // (step_size + value_size)
        return np.frombuffer(tail, TAIL_FORMAT[0], n).copy(), np.frombuffer(tail, TAIL_FORMAT[1], n, offset=step_size * n).copy(), seen

    @staticmethod
    def put_stream(db: sqlite3.Connection, run: str, metric: str, steps: np.ndarray, values: np.ndarray, seen: int) -> None:
        # Packed, not JSON: the daemon writes every busy stream's tail (up to 400 points) each pass.
        tail = np.ascontiguousarray(steps, TAIL_FORMAT[0]).tobytes() + np.ascontiguousarray(values, TAIL_FORMAT[1]).tobytes()
        db.execute("INSERT OR REPLACE INTO streams (run, metric, tail, seen) VALUES (?,?,?,?)", (run, metric, tail, seen))

    # --- incidents and outbox ----------------------------------------------------------------
    def incident(self, run: str, rule: str, step: int) -> tuple | None:
        return self.db.execute(
            "SELECT id, status, body, quiet, notified_value, notified_at, top_cause FROM incidents WHERE run=? AND rule=? AND step=?", (run, rule, step)
        ).fetchone()

    def open_incidents(self, run: str) -> list[tuple]:
        return self.db.execute("SELECT id, rule, step, body FROM incidents WHERE run=? AND status='open'", (run,)).fetchall()

    def pending(self, limit: int = 100) -> list[tuple]:
        return self.db.execute(
            "SELECT id, incident_id, kind, payload, attempts FROM outbox WHERE sent_at IS NULL AND permanent=0 ORDER BY id LIMIT ?", (limit,)
        ).fetchall()

    def mark_failed(self, outbox_id: int, error: str, *, permanent: bool) -> None:
        self.db.execute("UPDATE outbox SET attempts=attempts+1, last_error=?, permanent=? WHERE id=?", (error, int(permanent), outbox_id))



def read_summary(path: Path) -> dict[str, list[dict[str, object]]]:
    """What `lossguard status` shows, read-only (safe while the daemon runs)."""
    from .cursor import Cursor

    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        q = db.execute
        return {
            "files": [
                {"path": p, "run": r, "format": f, "offset": Cursor.from_json(c).offset, "dead": bool(d)}
                for p, r, f, c, d in q("SELECT path, run, format, cursor, dead FROM files ORDER BY path")
            ],
            "open_incidents": [{"run": r, "rule": ru, "step": st} for r, ru, st in q("SELECT run, rule, step FROM incidents WHERE status='open' ORDER BY run, step")],
            "undelivered": [
                {"id": i, "kind": k, "attempts": a, "error": e, "permanent": bool(p)}
                for i, k, a, e, p in q("SELECT id, kind, attempts, last_error, permanent FROM outbox WHERE sent_at IS NULL ORDER BY id")
            ],
        }
    finally:
        db.close()
