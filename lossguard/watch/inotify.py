"""inotify through watchdog: the one module that imports it.

The daemon only needs to know which files changed between two passes, not every write: a trainer
that flushes each line raises an IN_MODIFY per line, and watchdog spends a few tenths of a
millisecond of Python across three threads on each one it reads. The kernel folds a new event into
the last unread one when they are the same (same file, same kind), so the reader thread here rests
HOLD seconds after each batch it handles: a file written a thousand times a second then costs ~1/HOLD
events a second. The first change after a quiet spell is still read at once; a change that comes
during the rest waits for its end, which costs an alert at most HOLD (a busy run's passes are
BUSY_SPACING apart anyway: its alerts came within 0.25 s at 1,000 steps a second, p95)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent, DirDeletedEvent, DirMovedEvent, FileCreatedEvent, FileDeletedEvent, FileModifiedEvent, FileMovedEvent, FileSystemEventHandler,
)
from watchdog.observers.api import DEFAULT_OBSERVER_TIMEOUT, BaseObserver
from watchdog.observers.inotify import InotifyEmitter
from watchdog.observers.inotify_c import InotifyFD

from ..ingest.sources.sqlite_db import is_side_file

HOLD = 0.2
# Asked of the kernel, so that our own reads (open, close) and attribute changes raise no events at
# all. A write's close is not asked for either: its IN_MODIFY already said so, and a writer that opens
# the file for each append would otherwise alternate modify/close events, which the kernel cannot fold.
WANTED = [FileModifiedEvent, FileCreatedEvent, FileDeletedEvent, FileMovedEvent, DirCreatedEvent, DirDeletedEvent, DirMovedEvent]


class _Changed(FileSystemEventHandler):
    """Notes which file changed, or that the tree did (a folder came or went, a file moved or was
    deleted: only a walk can tell what that means for the runs). It sees only the WANTED events:
    watchdog drops the others, so neither our own reads nor a folder's mtime reach it."""

    def __init__(self, note: Callable[[str | None], None]) -> None:
        self.note = note

    def on_any_event(self, event) -> None:  # noqa: ANN001
        path = os.fsdecode(event.src_path)
        if not event.is_directory and is_side_file(path):
            # A database's WAL, journal or shared memory coming and going around each write is a
            # write to the database (Tracker.recheck), not the tree changing: no walk for it.
            self.note(path)
        elif event.is_directory or event.event_type in ("moved", "deleted"):
            self.note(None)
        else:
            self.note(path)


class _RestingFD(InotifyFD):
    """watchdog's inotify reader, resting `hold` seconds after each batch so that repeated writes
    to a file reach us as one event."""

    def __init__(self, hold: float) -> None:
        super().__init__()
        self.hold = hold

    def run(self) -> None:
        while self.should_keep_running():
            for event in self.read_events():
                self.handle_event(event)
            self.stopped_event.wait(self.hold)


class Observer(BaseObserver):
    """watchdog's inotify observer with the resting reader."""

    def __init__(self, *, hold: float = HOLD) -> None:
        self.reader = _RestingFD(hold)
        self.reader.start()
        super().__init__(InotifyEmitter, timeout=DEFAULT_OBSERVER_TIMEOUT, inotify_fd=self.reader)

    def on_thread_stop(self) -> None:
        super().on_thread_stop()
        self.reader.stop()
        self.reader.join()


def watch(roots: Iterable[Path], note: Callable[[str | None], None], *, hold: float = HOLD) -> Observer:
    """A started observer calling `note(path)` for a file written or created under the roots, and
    `note(None)` when folders or files came, went or moved."""
    observer = Observer(hold=hold)
    handler = _Changed(note)
    for root in roots:
        if root.exists():
            observer.schedule(handler, str(root if root.is_dir() else root.parent), recursive=True, event_filter=WANTED)
    observer.start()
    return observer
