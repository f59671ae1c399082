"""Delivery beside a state that another writer holds, and beside a sink that hangs: a post Slack
accepted is recorded (in the state or, while it is locked, in the sink's journal) and never sent
again, through kill -9; a pass takes the write lock only to judge and commit; each sink is served
by a job of its own, so a hanging Slack delays no other sink."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

from lossguard.alerts.journal import Journal
from lossguard.alerts.pipeline import Dispatcher
from lossguard.alerts.sinks import JsonlSink
from lossguard.watch.follow import Follower
from lossguard.model import Notice
from lossguard.detection.rules import load_rules
from lossguard.state import State

from .slack_server import Answer
from .test_watch import _calm, _line
from .test_watch_slack import _daemon, _posts, _wait


def _lock(db: Path) -> sqlite3.Connection:
    """An outside writer holding the state's write lock (a sqlite3 shell left in BEGIN IMMEDIATE)."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=5)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def test_a_pass_holds_no_write_lock_while_it_walks_and_reads(tmp_path):
    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(_calm(range(1, 30)))
    state = State(tmp_path / "state")
    follower = Follower([tmp_path / "runs"], rules=load_rules(None), state=state, log=lambda s: None)
    walking, go_on = threading.Event(), threading.Event()
    walk = follower.tracker.walk

    def slow_walk(*args, **kwargs):  # a walk hung on NFS
        walking.set()
        go_on.wait(10)
        return walk(*args, **kwargs)

    follower.tracker.walk = slow_walk
    passing = threading.Thread(target=follower.run_pass, args=(time.time(),))
    passing.start()
    try:
        assert walking.wait(10)
        other = sqlite3.connect(state.path, isolation_level=None, timeout=0.5)
        other.execute("BEGIN IMMEDIATE")  # (a `silence add`, the sender recording a post: not held up)
        other.execute("COMMIT")
        other.close()
    finally:
        go_on.set()
        passing.join(10)
    assert state.files()[str(log)].cursor  # the pass went on and committed its offsets
    state.close()


def _queued(state: State, n: int) -> None:
    with state.transaction() as tx:
        for i in range(n):
            tx.enqueue(Notice("stalled", f"run{i}", step=i, minutes=1.0), incident_id=None, sinks=["jsonl"], now=time.time())


def test_a_delivery_recorded_while_the_state_is_locked_is_kept_in_the_journal_and_folded_in_later(tmp_path):
    owner = State(tmp_path / "state")
    _queued(owner, 3)
    out = tmp_path / "out.jsonl"
    sender = Dispatcher(owner.secondary(lock_wait=0.2), {"jsonl": JsonlSink(out)})
    lines = []

    class Counting(JsonlSink):
        def send(self, post):  # noqa: ANN001
            lines.append(post.notice.run)
            if len(lines) == 1:
                sender._outside = _lock(owner.path)  # taken while the first post is being delivered
            return super().send(post)

    sender.sinks["jsonl"] = Counting(out)
    assert sender.round() == 1  # delivered, recorded in the journal, then the sink waits
    journal = Journal(sender.state, "jsonl")
    assert journal.waiting() and lines == ["run0"]
    assert sender.round() == 0 and lines == ["run0"]  # still locked: nothing sent, nothing again
    sender._outside.execute("ROLLBACK")
    assert sender.round() == 2 and lines == ["run0", "run1", "run2"]  # folded in, then the rest
    assert not journal.waiting() and not owner.pending(sink="jsonl")
    owner.close()


def test_a_post_accepted_while_the_state_is_locked_is_never_posted_again_through_a_kill_9(tmp_path, slack):
    log = tmp_path / "runs" / "exp" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(_calm(range(1, 20)))
    w = _daemon(tmp_path, slack).start()
    db = tmp_path / "state" / "state.db"
    outside = None
    try:
        w.wait_settled()
        locked = threading.Event()
        slack.queue.append(Answer(hold=locked))  # the post is in flight when the outside writer takes the lock
        with open(log, "a") as fh:
            fh.write(_line(20, 9.0))
        _wait(lambda: len(_posts(slack)) >= 1)
        outside = _lock(db)
        locked.set()  # (Slack accepts it now, the state locked: however slow this machine is)
        journal = tmp_path / "state" / "delivered.journal.slack"
        _wait(lambda: journal.exists())
        time.sleep(2.5)  # rounds come every second: none of them posts it again
        assert len(_posts(slack)) == 1
        w.kill9()
        outside.execute("ROLLBACK")
        outside.close()
        outside = None
        w.start()
        w.settle()
        alerts = [p for p in _posts(slack) if "exp" in p.body["text"] and not p.body.get("thread_ts")]
        assert len(alerts) == 1, [p.body["text"] for p in _posts(slack)]
        assert not journal.exists()
    finally:
        if outside is not None:
            outside.execute("ROLLBACK")
        err = w.stop_and_read()
    assert "kept while the state was locked are now in the state" in err  # (the restarted daemon's log)


def test_a_hanging_slack_delays_no_other_sink(tmp_path, slack):
    runs = tmp_path / "runs"
    for run in ("a", "b"):
        (runs / run).mkdir(parents=True)
        (runs / run / "metrics.jsonl").write_text(_calm(range(1, 20)))
    w = _daemon(tmp_path, slack).start()
    try:
        w.wait_settled(), w.wait_ready(files=2)
        hanging = Answer(hold=threading.Event())  # Slack hangs on the first alert until b's line is in
        slack.queue.append(hanging)
        with open(runs / "a" / "metrics.jsonl", "a") as fh:
            fh.write(_line(20, 9.0))
        _wait(lambda: len(_posts(slack)) >= 1)
        wrote = time.monotonic()
        with open(runs / "b" / "metrics.jsonl", "a") as fh:
            fh.write(_line(20, 9.0))
        w.wait_for(lambda ev: any(e["event"] == "opened" and e["run"] == "b" for e in ev), timeout=20)
        took = time.monotonic() - wrote
        assert not hanging.answered.is_set() and len(_posts(slack)) == 1, (took, len(_posts(slack)))  # Slack still hangs
        hanging.hold.set()
        _wait(lambda: any('"b"' in json.dumps(p.body) or " b " in p.body["text"] for p in _posts(slack)[1:]))
    finally:
        w.stop_and_read()



def test_a_reload_that_meets_a_locked_state_still_puts_permanent_failures_back_in_line(tmp_path):
    from lossguard.watch.daemon import Daemon
    from lossguard.ingest.reader import ReadOptions

    (tmp_path / "runs").mkdir()
    daemon = Daemon([tmp_path / "runs"], rules_loader=lambda: load_rules(None), state_dir=tmp_path / "state",
                    sinks={"jsonl": JsonlSink(tmp_path / "out.jsonl")}, options=ReadOptions())
    try:
        _queued(daemon.state, 2)
        daemon.state.mark_failed(daemon.state.pending(sink="jsonl"), "permanent error: x", permanent=True)
        daemon.state.db.execute("PRAGMA busy_timeout=100")  # (the daemon waits 30 s: the test, a moment)
        outside = _lock(daemon.state.path)
        daemon._retry_failed("reload")  # before: StateBusy out of the pass, and the reload's retry was lost
        assert daemon.state.pending(sink="jsonl") == []
        outside.execute("ROLLBACK")
        daemon._one_pass()  # the next pass asks again
        assert len(daemon.state.pending(sink="jsonl")) == 2
    finally:
        daemon.state.close()
        for d in daemon.dispatchers.values():
            d.state.close()


def test_a_journal_folded_again_after_a_kill_before_its_removal_makes_the_same_rows(tmp_path):
    state = State(tmp_path / "state")
    _queued(state, 1)
    (entry,) = state.pending(sink="jsonl")
    journal = Journal(state, "jsonl")
    for _ in range(2):  # (the second: the first fold's rows committed, the file not yet removed)
        journal.write("mark_sent", [entry], now=5.0, thread="C1|1.000001", alert_in="slack", joins=None)
        assert journal.fold() and not journal.waiting()
    assert state.db.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
    assert state.db.execute("SELECT attempts, sent_at FROM outbox").fetchall() == [(1, 5.0)]
    state.close()
