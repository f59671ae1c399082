"""Which files the daemon follows, and whether a path still holds the file it was reading: a stat
and the first bytes tell an append from a rotation (renamed: read on under the new name), a
replacement (read the new file from the start) or a truncation in place (copytruncate: start over).
Nothing here reads content or writes the state: it says what is what, the pass acts on it."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from ..ingest.cursor import Cursor
from ..errors import UsageError
from ..escaping import decodable
from ..state import FileRow
from ..ingest.discover import CANNOT_ENTER, CANNOT_LIST, Listings, collect, is_log, trainer_state_owner
from ..ingest.sources import sqlite_db
from ..ingest.sources.wandb_log import FILE_HEADER as WANDB_HEADER

FINGERPRINT = 64
"""Bytes at the head of a file that identify it together with (device, inode)."""
SHARED_HEADS = (WANDB_HEADER,)
"""Heads every file of a format starts with (a W&B transaction log's 7 bytes, all wandb-core
writes for its first 15 s): a fingerprint no longer than one tells no two such files apart."""


@lru_cache(maxsize=65536)
def _cursor(text: str) -> Cursor:
    return Cursor.from_json(text)


def offset_of(row: FileRow) -> Cursor:
    """The row's cursor (parsed once per distinct state: idle passes see the same JSON again)."""
    return _cursor(row.cursor)


def _look(path: str, cursor: Cursor | None) -> tuple[bytes, bool]:
    """The file's first bytes, and whether the bytes before the cursor's offset are still those it
    read there (Cursor.behind; True when it kept none): one open for both."""
    with open(path, "rb") as fh:
        head = fh.read(FINGERPRINT)
        if cursor is None or not cursor.behind:
            return head, True
        behind = bytes.fromhex(cursor.behind)
        fh.seek(max(cursor.offset - len(behind), 0))
        return head, fh.read(len(behind)) == behind


def _same_file(row: FileRow, device: int, inode: int, head: bytes) -> bool:
    if (row.device, row.inode) != (device, inode):
        return False
    n = min(len(row.fingerprint), len(head))
    if sqlite_db.is_database(row.fingerprint):
        n = min(n, len(sqlite_db.MAGIC))  # (the rest of a database's header changes with every write)
    return row.fingerprint[:n] == head[:n]


def _telling(fingerprint: bytes, head: bytes) -> bool:
    """Whether two heads share more than every file of some format starts with: a new run's file
    given the inode of another run's deleted one must not be read on as that one renamed."""
    n = min(len(fingerprint), len(head))
    return not any(len(shared) >= n and shared[:n] == head[:n] for shared in SHARED_HEADS)


@dataclass(frozen=True)
class Sighting:
    """A followed file as a pass finds it: the row to read it with, and its size and mtime now."""

    row: FileRow
    size: int
    mtime: int

    @property
    def unchanged(self) -> bool:
        """Nothing new since the last read: no read, no write (what keeps 1,000 idle runs cheap)."""
        cursor = offset_of(self.row)
        return self.row.format is not None and self.size == cursor.offset and self.row.mtime == self.mtime and not cursor.skipping


def _unread_folders(problems: Sequence) -> tuple[str, ...]:
    """Folders this walk could not enter or list but that are still there (no descriptor left, an
    NFS server not answering): the files under them are not gone, only unseen for now. Dropping
    them would read them again from the start once the folder can be listed."""
    folders = (p.source for p in problems if p.message.startswith((CANNOT_LIST, CANNOT_ENTER)))
    return tuple(os.path.join(f, "") for f in folders if os.path.lexists(f))


def own_files(written: Sequence[Path]) -> frozenset[tuple[int, int]]:
    """(device, inode) of what the daemon itself writes, never a training log whatever its name:
    its own stdout and stderr when they are files (`lossguard watch runs/ > runs/watch.log`), the
    files named in `written` (the JSON-lines sink's) and those in its folders (the state's
    database, its WAL, its lock)."""
    ids = set()
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            ids.add((st.st_dev, st.st_ino))
    for path in written:
        try:
            entries = [e.path for e in os.scandir(path)] if path.is_dir() else [path]
            for entry in entries:
                st = os.stat(entry)
                ids.add((st.st_dev, st.st_ino))
        except OSError:
            continue  # (not written yet)
    return frozenset(ids)


def within(path: str, roots: Sequence[str]) -> bool:
    """Whether a path is one of the roots (one object's copy) or lies below one."""
    return any(path == r or path.startswith(os.path.join(r, "")) for r in roots)


def warned_through(log: Callable[[str], None]) -> Callable[[str], None]:
    """Warnings about input said through a plain `log`, after the words scan prints them with
    (`lossguard watch` on a console, a caller that passes no `warn`)."""
    return lambda text: log(f"warning: {text}")


def _carry_checkpoints(current: dict[str, Sighting], tracked: Mapping[str, FileRow], gone: Sequence[str], log: Callable[[str], None]) -> None:
    """A HF output folder's newest trainer_state.json (discovery follows only that one) replaces the
    one followed before it, a checkpoint earlier, whose history it repeats: it is read on from where
    that one stopped (the format checks the entry there is the same), so a spike in the history is
    not announced again at every checkpoint."""
    before = {}
    for path in gone:
        owned = trainer_state_owner(Path(path))
        if owned is not None and tracked[path].format is not None:
            before[owned[0]] = tracked[path]
    for path, seen in list(current.items()):
        owned = trainer_state_owner(Path(path))
        if owned is None or path in tracked or owned[0] not in before:
            continue
        old = before.pop(owned[0])
        current[path] = replace(seen, row=replace(seen.row, run=old.run, format=old.format, cursor=old.cursor))
        log(f"{path}: a later checkpoint of {old.path}'s run; reading on from entry {offset_of(old).index} of its log_history")


@dataclass
class Tracker:
    roots: Sequence[Path]
    globs: Sequence[str] = ()
    """File-name patterns of the user's own formats (ReadOptions.globs)."""
    log: Callable[[str], None] = print
    written: Sequence[Path] = ()
    """What the daemon writes (its state folder, its JSON-lines file): own_files."""
    warn: Callable[[str], None] | None = None
    """What is wrong with the input (None: `log`, after "warning: ": warned_through)."""
    _listings: Listings = field(default_factory=Listings)
    _warned: set[str] = field(default_factory=set)
    _own: frozenset[tuple[int, int]] = frozenset()

    def walk(self, tracked: Mapping[str, FileRow], *, quiet: bool, held: Sequence[str] = (),
             history: Sequence[str] = ()) -> tuple[dict[str, Sighting], list[str]]:
        """Every log under the roots, and the followed paths that are gone. `quiet`: files met now
        are history (the first start): read for the windows, not alerted on. `history`: roots whose
        new files are history all the same; `held`: roots whose files are not followed yet (an
        object store whose history is owed and that has not answered: followed.py is told by the
        pass). Roots are listed all the same: run names depend on the set of roots given."""
        try:
            found, problems = collect(self.roots, globs=self.globs, listings=self._listings)
        except UsageError as exc:
            self._warn_once(str(exc))
            found, problems = [], []
        if held:
            found = [f for f in found if not within(str(f.path), held)]
        for p in problems:
            self._warn_once(str(p))
        by_ident = {(r.device, r.inode): r for r in tracked.values()}
        current: dict[str, Sighting] = {}
        self._own = own_files(self.written)
        for f in found:
            path = str(f.path)
            if not path.isascii() and decodable(path) != path:
                self._warn_once(f"{decodable(path)}: the name is not valid UTF-8; read all the same, and shown with the bytes escaped")
            seen = self._identify(path, f.run, tracked.get(path), by_ident, quiet or within(path, history))
            if seen is not None:
                current[path] = seen
        listed = {str(f.path) for f in found}
        idents = {(s.row.device, s.row.inode) for s in current.values()}
        unread = _unread_folders(problems)
        gone = [p for p, r in tracked.items() if p not in current and (p not in listed or (r.device, r.inode) in self._own)
                and (r.device, r.inode) not in idents and not p.startswith(unread) and not within(p, held)]
        _carry_checkpoints(current, tracked, gone, self.log)
        for path in gone:
            self.log(f"{path}: file is gone; no longer followed")
        return current, gone

    def recheck(self, changed: Collection[str], tracked: Mapping[str, FileRow]) -> dict[str, Sighting] | None:
        """The files inotify said changed, when they are all files we follow (appends: the hot
        path); None when the tree itself changed (a new log, a file gone) and only a walk can tell
        what is what."""
        current: dict[str, Sighting] = {}
        for path in changed:
            row = tracked.get(path)
            if row is None:
                if is_log(path, self.globs) and not self._is_own(path):
                    return None
                continue  # checkpoints, wandb files, our own state and log: nothing to read
            seen = self._identify(path, row.run, row, {}, False)
            if seen is None:
                return None
            current[path] = seen
        return current

    def _is_own(self, path: str) -> bool:
        """A file the daemon writes (its log, its JSON lines), looked for again when one not known
        yet changes (the JSON-lines file appears with the first alert)."""
        try:
            st = os.stat(path)
        except OSError:
            return False
        if (st.st_dev, st.st_ino) not in self._own:
            self._own = own_files(self.written)
        return (st.st_dev, st.st_ino) in self._own

    @staticmethod
    def named(changed: Collection[str]) -> set[str]:
        """The files inotify's changed paths are writes to: a WAL-mode write lands in `x.db-wal`,
        and it is `x.db` that changed; a database's other side files (readers' `-shm`, ours too, a
        `-journal` around a write the database itself shows) name nothing to read."""
        return {sqlite_db.database_of(p) or "" if sqlite_db.is_side_file(p) else p for p in changed} - {""}

    def _identify(self, path: str, run: str, row: FileRow | None, by_ident: Mapping, quiet: bool) -> Sighting | None:
        """The row to read `path` with: the saved one if the file is the one we followed, a fresh one
        if it is new, replaced or truncated, the old one renamed if it moved here (rotation)."""
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) in self._own:
                return None  # (its own log or alerts, under a folder it follows: no training log)
            # A database's size and time are its WAL's too (a WAL-mode write changes only that).
            size, mtime = sqlite_db.stamp(path, st) if row is not None and sqlite_db.is_database(row.fingerprint) else (st.st_size, st.st_mtime_ns)
            # A stat is enough for a file untouched since the last read; one that changed gets its
            # first bytes compared too (truncated and rewritten between two passes, even to the
            # same size).
            settled = (
                row is not None and (row.device, row.inode) == (st.st_dev, st.st_ino) and len(row.fingerprint) >= FINGERPRINT
                and size == offset_of(row).offset and row.mtime == mtime
            )
            head, kept = (row.fingerprint, True) if settled else _look(path, None if row is None else offset_of(row))
            if row is None and sqlite_db.is_database(head):
                size, mtime = sqlite_db.stamp(path, st)
        except OSError:
            return None
        found = self._row(path, run, row, by_ident, quiet, (st.st_dev, st.st_ino, size), head, kept)
        return Sighting(found, size, mtime)

    def _row(self, path: str, run: str, row: FileRow | None, by_ident: Mapping, quiet: bool, stat: tuple[int, int, int], head: bytes,
             kept: bool = True) -> FileRow:
        device, inode, size = stat
        if row is not None and _same_file(row, device, inode, head):
            # (A database shrinks when it is checkpointed or VACUUMed: its reader tells rows
            # renumbered from rows added, sources.sqlite_db.)
            shrank = size < offset_of(row).offset and not sqlite_db.is_database(head)
            if shrank or not kept:
                # Its steps start again: the run's next timeline (a resume), its spikes new incidents.
                why = "file shrank below the read offset (truncated in place, copytruncate?)" if shrank else (
                    "file written again from its start in place (the bytes before the read offset changed: a new run logging to it?)")
                self.log(f"{path}: {why}: reading it again from the start")
                return FileRow(path, row.run, row.format, device, inode, head, Cursor().to_json(), False, 0)
            if len(row.fingerprint) < FINGERPRINT and len(head) > len(row.fingerprint):
                return replace(row, fingerprint=head)
            return row
        moved = by_ident.get((device, inode))
        if moved is not None and moved.path != path and _same_file(moved, device, inode, head) and _telling(moved.fingerprint, head):
            # Renamed (log rotation): keep reading it from where we were, under its new name.
            self.log(f"{moved.path}: renamed to {path}; reading on from byte {offset_of(moved).offset}")
            return replace(moved, path=path)
        if row is not None:
            self.log(f"{path}: replaced by another file; reading the new one from the start")
        # History found at the first start is read (to fill the windows) but not alerted on.
        return FileRow(path, run, None, device, inode, head, Cursor().to_json(), False, size if quiet else 0)

    def _warn_once(self, text: str) -> None:
        if text not in self._warned:
            self._warned.add(text)
            (self.warn or warned_through(self.log))(text)
