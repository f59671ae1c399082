"""Private copies of locked databases cost a copy once, not at every look, and what a killed
process left of them is taken away: an application's SQLite file a writer keeps locked under a
followed folder must not cost a copy of up to 256 MiB at every pass, for ever."""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time

from lossguard.ingest.sources import sqlite_db


def _locked_app_db(tmp_path):
    """An application's database (no tracker's tables) that a writer holds in an exclusive
    transaction: returns the writer's connection, which keeps the lock while open."""
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE sessions (id INTEGER PRIMARY KEY, user TEXT)")
        db.executemany("INSERT INTO sessions (user) VALUES (?)", [(f"u{i}",) for i in range(100)])
    db.close()
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    writer.execute("INSERT INTO sessions (user) VALUES ('held')")
    return path, writer


def test_a_locked_database_is_copied_once_while_it_stays_as_it_was_and_again_once_it_changed(tmp_path, monkeypatch):
    path, writer = _locked_app_db(tmp_path)
    copies = []
    real = sqlite_db._private_copy
    monkeypatch.setattr(sqlite_db, "_private_copy", lambda *a: copies.append(1) or real(*a))
    try:
        for _ in range(3):
            assert sqlite_db.tables(path) == frozenset({"sessions"})
        assert len(copies) == 1
        writer.execute("CREATE TABLE more (x)")
        writer.execute("COMMIT")
        writer.execute("BEGIN EXCLUSIVE")
        writer.execute("INSERT INTO more VALUES (1)")
        assert sqlite_db.tables(path) == frozenset({"sessions", "more"})
        assert len(copies) == 2
    finally:
        writer.close()


def test_copy_folders_a_killed_process_left_are_removed_and_fresh_ones_kept():
    stale = tempfile.mkdtemp(prefix=sqlite_db.COPY_PREFIX)
    fresh = tempfile.mkdtemp(prefix=sqlite_db.COPY_PREFIX)
    other = tempfile.mkdtemp(prefix="someone-else-")
    open(os.path.join(stale, "copy.db"), "wb").close()
    hour_ago = time.time() - 7200
    os.utime(stale, (hour_ago, hour_ago))
    os.utime(other, (hour_ago, hour_ago))
    try:
        assert sqlite_db.remove_stale_copies(older_than=3600) >= 1
        assert not os.path.exists(stale) and os.path.isdir(fresh) and os.path.isdir(other)
    finally:
        for folder in (fresh, other):
            os.rmdir(folder)
