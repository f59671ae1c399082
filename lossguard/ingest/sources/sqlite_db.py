"""SQLite databases that other programs write (trackers: MLflow, trackio), read without getting in
their way: the one module that opens them.

A tracker's database is written while we read it, by a trainer that must never wait for us. So it
is opened read-only (`mode=ro`: we can take no write lock), each statement fetches one batch and is
done (a reader's shared lock, which in rollback-journal mode holds a writer's commit back, lasts a
batch, not a read), and a writer's lock is waited for BUSY_WAIT at most: then the read says "locked,
try again" and the next pass reads it, with nothing lost, since a read only moves on past the rows
it got. In WAL mode (trackio) readers and the writer never wait for each other, but a write lands
in `x.db-wal`, not `x.db`: what a database's size and time are (`stamp`) counts both.

A database is read on from a watermark, its table's integer key (rowid or `id`), as a text file is
read on from an offset. `Cursor.offset` is what the daemon compares with the file's size to skip an
unchanged file with one stat: for a database it is the stamp's size at the start of a read that got
every row, so an unchanged database costs one stat and any write (the file or its WAL growing, or
its time moving) makes the next pass read it. A read cut short (`limit`) says how far it got in
proportion, below the size. Rows renumbered (VACUUM) or a database replaced in place are told by
the row at the watermark no longer being the one read there (`Cursor.mark`): the database is read
again from its start (the state's incident keys, by run, rule and step, keep that from alerting twice).

A database a writer holds locked for longer than BUSY_WAIT, or one whose writer died mid-commit
(its hot journal can only be rolled back by a connection that may write, which a read-only one is
not: SQLITE_READONLY_ROLLBACK), is read from a private copy of the file and its journal or WAL:
SQLite rolls the copy's journal back (or takes only the WAL's committed frames), so what is read
is what was committed, never the pages of a transaction under way. The copy is taken only when
the files are the same before and after it (a commit in between would tear it) and COPY_LIMIT
bounds it; otherwise the read says why and the next pass tries again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar
from urllib.parse import quote

from ..cursor import Cursor
from ..problems import Problem

MAGIC = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database. The rest of its 100-byte header changes with
writes (the change counter, the page count): only these identify the file from its head."""
SUFFIXES = (".db", ".sqlite", ".sqlite3")
"""Names a database goes by: candidates for discovery, whose content says whose they are."""
SIDE_FILES = ("-wal", "-shm", "-journal")
"""What SQLite keeps beside `x.db` while it is written: never logs of their own."""
BUSY_WAIT = 0.25
"""Seconds a read waits for a writer's lock before it gives up until the next pass."""
BATCH = 20_000
"""Rows one statement fetches: a transaction of its own, a few ms, so a writer waits that long at most."""
COPY_LIMIT = 256 << 20
"""Bytes of a database with its journal or WAL at most copied to read what was committed past a
writer's lock or a dead writer's journal: a larger one is read again at the next pass."""
MIN_ROWS = 1_000
"""Rows a read cut short by its limit still gets, whatever the bytes a row seems to take."""
T = TypeVar("T")
RESTARTED = "rows renumbered (VACUUM?) or the database replaced: read again from its start (incidents already raised are not raised again)"


class Unreadable(Exception):
    """A database that can not be read now; `dead`: nor ever as it is (not a database, damaged)."""

    def __init__(self, message: str, *, dead: bool) -> None:
        super().__init__(message)
        self.message = message
        self.dead = dead


def is_database(head: bytes) -> bool:
    return head.startswith(MAGIC)


def is_side_file(path: str) -> bool:
    return path.endswith(SIDE_FILES)


def database_of(path: str) -> str | None:
    """The database whose write a change to `path` is (`x.db-wal` -> `x.db`); None for a path that
    is no database's side file. Only the WAL holds rows: `-shm` is readers' shared memory (ours
    too), and a `-journal` comes and goes around a write the database itself shows."""
    return path[: -len("-wal")] if path.endswith("-wal") else None


def stamp(path: str | Path, st: os.stat_result | None = None) -> tuple[int, int]:
    """(size, mtime in ns) of a database and its WAL together: a WAL-mode write grows or touches
    only the WAL (and a checkpoint moves pages from it into the file)."""
    st = st if st is not None else os.stat(path)
    try:
        wal = os.stat(f"{os.fspath(path)}-wal")
    except OSError:
        return st.st_size, st.st_mtime_ns
    return st.st_size + wal.st_size, max(st.st_mtime_ns, wal.st_mtime_ns)


COPY_PREFIX = "lossguard-db-"
"""The temporary folders private copies are made in (removed after each read; remove_stale_copies
takes what a killed process left)."""
BLOCKED = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_READONLY_ROLLBACK", "SQLITE_READONLY_RECOVERY", "SQLITE_READONLY_CANTINIT", "SQLITE_READONLY_CANTLOCK")
"""What a read-only open says of a database that a writer holds locked, whose journal a dead writer
left hot, or whose WAL must be recovered first: a private copy can still be read."""


def _unreadable(exc: sqlite3.Error) -> Unreadable:
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return Unreadable(f"database locked by a writer (waited {BUSY_WAIT:g} s); read again at the next pass, nothing is lost", dead=False)
    if name.startswith("SQLITE_NOTADB"):
        return Unreadable("not a SQLite database after all; no longer read", dead=True)
    if name.startswith("SQLITE_CORRUPT"):
        return Unreadable("database disk image is malformed; no longer read", dead=True)
    return Unreadable(f"cannot read the database ({exc}); read again at the next pass", dead=False)


class Connection(sqlite3.Connection):
    """A connection that says how it was opened: `told`, what a read of it must say (it reads a
    private copy: the database was locked, or a writer died mid-commit), or None."""

    told: str | None = None


@contextmanager
def opened(path: Path) -> Iterator[Connection]:
    """The database read-only, in autocommit (each statement its own transaction), or a private
    copy of it when a writer's lock or a dead writer's journal bars a read-only one (`told` says
    so); SQLite's errors come out as Unreadable."""
    with ExitStack() as spare:
        db = _open(path, lambda: Path(spare.enter_context(tempfile.TemporaryDirectory(prefix=COPY_PREFIX))))
        try:
            yield db
        except sqlite3.Error as exc:
            raise _unreadable(exc) from None
        finally:
            db.close()


def _connect(uri: str) -> Connection:
    db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_WAIT, check_same_thread=False, factory=Connection)
    assert isinstance(db, Connection)
    return db


def _open(path: Path, spare: Callable[[], Path]) -> Connection:
    """A read-only connection that could read the schema (SQLite takes its shared lock and looks
    for a hot journal then), else one onto a private copy (in the folder `spare` makes, removed
    with the connection's use)."""
    try:
        db = _connect(f"file:{quote(os.fspath(path))}?mode=ro")
    except sqlite3.Error as exc:
        raise _unreadable(exc) from None
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return db
    except sqlite3.Error as exc:
        db.close()
        name = getattr(exc, "sqlite_errorname", "") or ""
        if not name.startswith(BLOCKED):
            raise _unreadable(exc) from None
        hot = name.startswith("SQLITE_READONLY_ROLLBACK")
    copy, why = _private_copy(path, spare)
    if copy is None:
        raise Unreadable(_blocked(path, hot=hot, why=why), dead=False)
    try:
        db = _connect(f"file:{quote(os.fspath(copy))}?mode=rw")
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()  # (rolls the copy's journal back, or recovers its WAL)
    except sqlite3.Error as exc:
        raise _unreadable(exc) from None
    db.told = _blocked(path, hot=hot, why=None)
    return db


def _journal_bytes(path: Path) -> int:
    try:
        return os.stat(f"{os.fspath(path)}-journal").st_size
    except OSError:
        return 0


def _blocked(path: Path, *, hot: bool, why: str | None) -> str:
    """What a read says of a database a read-only connection could not read: read from a private
    copy (`why` None), or not at all, and why."""
    if hot:
        said = f"a writer died mid-commit: its journal holds {_journal_bytes(path):,} bytes of a transaction never committed"
        if why is None:
            return f"{said}; what was committed is read (from a private copy, the journal rolled back; the next writer to open the database rolls it back too)"
        return f"{said}, and {why}; read again at the next pass (or once a writer has opened the database: it rolls the journal back)"
    said = f"database locked by a writer (waited {BUSY_WAIT:g} s)"
    if why is None:
        return f"{said}; what it had committed is read (from a private copy)"
    return f"{said}, and {why}; read again at the next pass, nothing is lost"


def _private_copy(path: Path, spare: Callable[[], Path]) -> tuple[Path | None, str | None]:
    """A copy of the database with its journal or WAL (never the readers' `-shm`) in the folder
    `spare` makes, or None and why not: too big, or changed while copied. The file is copied before its journal: a
    page a writer overwrites in the file after that copy had its original put in the journal before
    (SQLite's order), so the journal copied later holds it; a commit that ends meanwhile deletes or
    rewrites the journal and changes the file, which the stats taken around the copy tell."""
    sides = [side for side in ("-journal", "-wal") if os.path.exists(f"{os.fspath(path)}{side}")]
    files = [os.fspath(path), *(f"{os.fspath(path)}{side}" for side in sides)]
    try:
        before = [_identity(f) for f in files]
        if sum(size for _, size, _ in before) > COPY_LIMIT:
            return None, f"it is larger than the {COPY_LIMIT >> 20} MiB read from a private copy at most"
        copy = spare() / "copy.db"
        for f, side in zip(files, ["", *sides]):
            shutil.copyfile(f, f"{copy}{side}")
        after = [_identity(f) for f in files]
    except FileNotFoundError:
        return None, "it changed while it was copied"
    except OSError as exc:
        return None, f"it could not be copied to read ({exc.strerror or exc})"
    if before != after:
        return None, "it changed while it was copied"
    return copy, None


def _identity(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def tables(path: Path) -> frozenset[str]:
    """The tables of a database (empty for a file that is none, or one that can not be read now)."""
    return tables_or_damage(path)[0]


_KNOWN_TABLES: dict[str, tuple[tuple, frozenset[str]]] = {}
"""Tables found by a read that needed a private copy, by path with the identity of the file and its
journal or WAL then: a database a writer keeps locked (an application's, which no reader will ever
take up) is copied once, not at every pass that looks at it again."""


def _identities(path: Path) -> tuple:
    out = []
    for side in ("", "-journal", "-wal"):
        try:
            out.append(_identity(f"{os.fspath(path)}{side}"))
        except OSError:
            out.append(None)
    return tuple(out)


def tables_or_damage(path: Path) -> tuple[frozenset[str], Unreadable | None]:
    """The tables of a database, and, where a file that starts as a database can not be read, why:
    for ever (cut short by a copy, overwritten: SQLite says it is malformed; such a file is a
    tracker's damaged database far more often than an application's, and is worth a word), or for
    now (a writer's lock no private copy could get past: read again later, never taken for an
    application's database)."""
    try:
        with open(path, "rb") as fh:
            if not is_database(fh.read(len(MAGIC))):
                return frozenset(), None
        key = os.fspath(path)
        known = _KNOWN_TABLES.get(key)
        if known is not None and known[0] == _identities(path):
            return known[1], None
        with opened(path) as db:
            found = frozenset(r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
            if db.told is not None:
                if len(_KNOWN_TABLES) >= 4096:
                    _KNOWN_TABLES.clear()
                _KNOWN_TABLES[key] = (_identities(path), found)
            return found, None
    except OSError:
        return frozenset(), None
    except Unreadable as exc:
        return frozenset(), exc


def remove_stale_copies(*, older_than: float = 3600.0) -> int:
    """Private copies a process killed while reading left behind (a read removes its own): the
    temporary folders of this prefix not touched for `older_than` seconds. Returns how many."""
    removed = 0
    now = time.time()
    try:
        entries = list(os.scandir(tempfile.gettempdir()))
    except OSError:
        return 0
    for entry in entries:
        try:
            if not entry.name.startswith(COPY_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            st = entry.stat(follow_symlinks=False)
            # (Only this user's: a shared temporary folder holds other users' copies, in use or not.)
            if st.st_uid == os.getuid() and now - st.st_mtime > older_than:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += not os.path.exists(entry.path)
        except OSError:
            continue
    return removed


def columns(db: sqlite3.Connection, table: str) -> frozenset[str]:
    return frozenset(r[1] for r in db.execute(f"PRAGMA table_info({table})"))


@dataclass(frozen=True)
class Table:
    """A table read on from a watermark: its name, its integer key, the columns fetched (after the
    key) and those whose values say which row a key holds (the mark)."""

    name: str
    key: str
    columns: str
    identity: str


@dataclass(frozen=True)
class Fetched(Generic[T]):
    batches: list[T]
    """What `each` made of each batch of rows past the watermark, in key order."""
    cursor: Cursor
    restarted: bool
    """The watermark's row was not the one read there: read again from the start."""


def fetch(db: sqlite3.Connection, table: Table, cursor: Cursor, each: Callable[[list[tuple]], T], *, size: int, limit: int | None) -> Fetched[T]:
    """The rows of `table` past the cursor's watermark, a batch a statement, each batch as `each`
    makes it ((key, *columns) tuples in, a frame out: a million rows never stand as Python
    tuples at once). With `limit` (bytes, as for files), about as many rows as that many bytes of
    the database hold. `size`: the database's stamp before the read (what the cursor's offset
    becomes once every row is read)."""
    last = db.execute(f"SELECT max({table.key}) FROM {table.name}").fetchone()[0] or 0
    at, restarted = cursor.index, False
    if at and (at > last or _mark(db, table, at) != cursor.mark):
        at, restarted = 0, True
    want = None if limit is None else max(MIN_ROWS, limit * last // max(size, 1))
    batches: list[T] = []
    got = 0
    while want is None or got < want:
        n = BATCH if want is None else min(BATCH, want - got)
        batch = db.execute(f"SELECT {table.key}, {table.columns} FROM {table.name} WHERE {table.key} > ? ORDER BY {table.key} LIMIT ?", (at, n)).fetchall()
        if batch:
            at, got = batch[-1][0], got + len(batch)
            batches.append(each(batch))
        if len(batch) < n:
            break
    done = at >= last
    mark = _mark(db, table, at) if got else cursor.mark if not restarted else None
    offset = size if done else min(size - 1, size * at // max(last, 1))
    return Fetched(batches, cursor.advance(offset=max(offset, 0), index=at, mark=mark), restarted)


@dataclass(frozen=True)
class Passed:
    """A row no reader can take (a step that is no whole number, no run id, values that are no
    JSON object or no number): passed over, the rows and runs beside it read all the same."""

    run: str
    key: int
    """The row's key in its table (rowid, trackio's id)."""
    why: str


def passed_over(source: str, passed: Iterable[Passed]) -> list[Problem]:
    """One warning a run for its rows passed over: the first, and how many more (a run that logs a
    float step every time is one line, not one a row)."""
    by_run: dict[str, list[Passed]] = {}
    for row in passed:
        by_run.setdefault(row.run, []).append(row)
    return [
        Problem(source, f"run {run}, row {rows[0].key}: {rows[0].why}; this row's values are skipped"
                + (f" (and {len(rows) - 1:,} more row(s) of this run no reader can take)" if len(rows) > 1 else ""))
        for run, rows in by_run.items()
    ]


def again(cursor: Cursor) -> Cursor:
    """The cursor after a read that got nothing (locked): one byte short of any size the database
    can have, so that the next pass's stat never takes it for unchanged, whatever its size."""
    return cursor.advance(offset=max(cursor.offset - 1, 0))


def _mark(db: sqlite3.Connection, table: Table, key: int) -> str | None:
    row = db.execute(f"SELECT {table.identity} FROM {table.name} WHERE {table.key} = ?", (key,)).fetchone()
    return None if row is None else hashlib.blake2b(repr(row).encode(), digest_size=6).hexdigest()
