"""State itself: the state directory claimed (created private, locked for one daemon), the file
opened, checked (quick_check) and laid out, or moved aside when damaged and started fresh; its id
and whether any pass has committed yet; and the unlocked connections the sender and the operator's
commands use beside a running daemon. What the state keeps is read and written by its parts, one
module a kind of row, which State is composed of."""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import time
import uuid
from collections import OrderedDict
from pathlib import Path

from .clicks import Clicks
from .errors import DAMAGED, StateError, StateLocked, StateTooNew
from .files import FilesAndTails
from .incidents import RunsAndIncidents
from .messages import Messages
from .outbox import Outbox
from .owed import OwedHistory
from .plots import Plots
from .rows import Tail
from .schema import VERSION, lay_out
from .silences import Silences

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


class State(FilesAndTails, RunsAndIncidents, Outbox, Messages, Plots, Silences, Clicks, OwedHistory):
    """The daemon's state directory, locked for this process (or, `attach` and `secondary`, a
    connection of its own beside it): opened, checked, laid out and, when damaged, moved aside here;
    what it keeps is read and written through its parts, each the owner of its tables."""

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
        lay_out(db, version)
        return db

    def close(self) -> None:
        if getattr(self, "db", None) is not None:
            self.db.close()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
