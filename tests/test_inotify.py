"""The inotify observer (watchdog with a resting reader): what the daemon hears of a busy file."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from lossguard.watch.inotify import watch

WRITER = """
import sys, time
with open(sys.argv[1], "a", buffering=1) as fh:
    t0 = time.perf_counter()
    for i in range(1000):
        fh.write(f"step {i} loss 2.0\\n")
        time.sleep(max(0.0, t0 + (i + 1) / 1000 - time.perf_counter()))
"""


def _listen(root):  # noqa: ANN001, ANN202
    heard: list[str | None] = []
    lock = threading.Lock()

    def note(path: str | None) -> None:
        with lock:
            heard.append(path)

    return heard, watch([root], note)


def _wait_for(cond, timeout: float = 10.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_a_file_flushed_every_line_is_heard_as_a_few_events_and_the_last_write_is_heard(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    log = run / "train.log"
    log.write_text("")
    heard, observer = _listen(tmp_path)
    try:
        time.sleep(0.2)
        heard.clear()
        # A trainer in its own process flushing every line, 1,000 lines a second for a second.
        subprocess.run([sys.executable, "-c", WRITER, str(log)], check=True)
        assert _wait_for(lambda: str(log) in heard)
        n = len(heard)
        # A last write after a pause is heard too: nothing is folded away for good.
        time.sleep(0.3)
        with open(log, "a") as fh:
            fh.write("step 2000 loss 2.0\n")
        assert _wait_for(lambda: len(heard) > n)
    finally:
        observer.stop()
        observer.join(5)
    assert set(heard) == {str(log)}
    assert len(heard) < 100, f"{len(heard)} events for 1,000 writes"


def test_new_folders_and_moves_are_heard_as_tree_changes(tmp_path):
    heard, observer = _listen(tmp_path)
    try:
        time.sleep(0.2)
        (tmp_path / "new_run").mkdir()
        assert _wait_for(lambda: None in heard)
        heard.clear()
        (tmp_path / "new_run" / "a.log").write_text("x\n")
        assert _wait_for(lambda: str(tmp_path / "new_run" / "a.log") in heard)
        (tmp_path / "new_run" / "a.log").rename(tmp_path / "new_run" / "a.log.1")
        assert _wait_for(lambda: None in heard)
    finally:
        observer.stop()
        observer.join(5)


def test_a_databases_side_files_coming_and_going_are_heard_as_writes_to_it_not_as_tree_changes(tmp_path):
    import sqlite3

    from lossguard.watch.followed import Tracker

    db = tmp_path / "mlflow.db"
    sqlite3.connect(db).close()
    heard, observer = _listen(tmp_path)
    try:
        time.sleep(0.2)
        with sqlite3.connect(db) as conn:  # (rollback-journal mode: a -journal made and deleted around the commit)
            conn.execute("CREATE TABLE t (v)")
        conn.close()
        wal = sqlite3.connect(db)
        wal.execute("PRAGMA journal_mode=WAL")
        wal.execute("INSERT INTO t VALUES (1)")
        wal.commit()
        wal.close()  # (the WAL checkpointed and deleted)
        assert _wait_for(lambda: f"{db}-wal" in heard)
        time.sleep(0.5)
    finally:
        observer.stop()
        observer.join(5)
    assert None not in heard, heard
    assert Tracker.named(heard) == {str(db)}
