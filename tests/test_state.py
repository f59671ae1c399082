"""The state store (a real SQLite file): typed rows in and out, tails bit for bit, older layouts
migrated, and a pass's writes all or nothing."""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import replace

import numpy as np
import pytest

from lossguard.model import Cause, Incident, Notice
from lossguard.state import VERSION, State, Tail

INC = Incident(
    run="exp/7b", metric="loss", rule="loss-spike", kind="ratio", severity="warning", step=700, peak_step=702,
    value=float("inf"), baseline=2.06, threshold=4.13, end_step=None, last_flagged_step=703, points=3, segment=1,
    causes=(Cause("gradient_explosion", 0.95123456, "grad_norm 48 = 45x", "Clip gradients"),),
)


@pytest.fixture
def state(tmp_path):
    s = State(tmp_path / "state")
    yield s
    s.close()


def test_stream_tails_keep_every_value_and_version_1_json_tails_are_still_read(tmp_path):
    state = State(tmp_path / "state")
    values = np.array([2.5, float("nan"), float("inf"), -float("inf"), 1e-300, 0.1 + 0.2])
    with state.transaction() as tx:
        tx.put_tail("r", "loss", Tail(np.arange(10, 16), values, 42))
    state.close()
    state = State(tmp_path / "state")  # from the file, not the cache
    tail = state.tail("r", "loss")
    assert tail.steps.tolist() == list(range(10, 16)) and tail.seen == 42
    assert tail.values.tobytes() == values.tobytes()  # bit for bit, NaN and infinities included
    state.close()
    # A state file from version 1 stored tails as JSON, non-finite values as strings.
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    db.execute("INSERT OR REPLACE INTO streams (run, metric, tail, seen) VALUES ('old', 'loss', '[[1, 2.0], [2, \"nan\"], [3, \"inf\"]]', 3)")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    state = State(tmp_path / "state")
    tail = state.tail("old", "loss")
    assert tail.steps.tolist() == [1, 2, 3] and tail.values[0] == 2.0 and math.isnan(tail.values[1]) and tail.values[2] == float("inf")
    assert state.db.execute("PRAGMA user_version").fetchone()[0] == VERSION
    state.close()


def test_a_rolled_back_pass_leaves_neither_rows_nor_cached_tails(state):
    with state.transaction() as tx:
        tx.put_tail("r", "loss", Tail(np.arange(3), np.ones(3), 3))
    with pytest.raises(RuntimeError), state.transaction() as tx:
        tx.put_tail("r", "loss", Tail(np.arange(5), np.zeros(5), 5))
        tx.add_incident(INC, source="a.log", quiet=False, now=1.0)
        raise RuntimeError("the pass failed")
    assert state.tail("r", "loss").seen == 3 and state.tail("r", "loss").values.tolist() == [1.0] * 3
    assert state.incident(INC.run, INC.rule, INC.step) is None


def test_incidents_and_outbox_entries_come_back_as_they_went_in(state):
    with state.transaction() as tx:
        ident = tx.add_incident(INC, source="runs/exp/train.log", quiet=False, now=5.0)
        tx.enqueue(Notice("opened", INC.run, INC, source="runs/exp/train.log"), incident_id=ident, sinks=["slack", "jsonl"], now=5.0)
        tx.enqueue(Notice("stalled", "other", step=40, minutes=31.5), incident_id=None, sinks=["slack"], now=5.0)
    row = state.incident(INC.run, INC.rule, INC.step)
    assert row.incident == INC and row.status == "open" and row.source == "runs/exp/train.log"
    assert (row.notified_value, row.notified_at, row.top_cause, row.quiet) == (INC.value, 5.0, "gradient_explosion", False)
    assert [r.incident for r in state.open_incidents(INC.run)] == [INC]
    assert state.incident_keys(INC.run, since=700) == {("loss-spike", 700)} and not state.incident_keys(INC.run, since=701)
    slack = state.pending(sink="slack")
    assert [(e.sink, e.notice.kind, e.incident_id) for e in slack] == [("slack", "opened", ident), ("slack", "stalled", None)]
    assert slack[0].notice.incident == INC and slack[1].notice == Notice("stalled", "other", step=40, minutes=31.5)
    assert state.pending_sinks() == ["jsonl", "slack"]
    state.mark_sent(slack[:1], now=6.0, thread="C1|1.5")
    state.mark_failed(slack[1:], "permanent error: not_in_channel", permanent=True)
    assert state.pending(sink="slack") == [] and state.thread(ident) == "C1|1.5"


def test_a_layout_2_file_is_migrated_with_its_undelivered_notifications(tmp_path):
    state = State(tmp_path / "state")
    state.close()
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    db.executescript(
        "DROP TABLE outbox; DROP TABLE incidents;"
        "CREATE TABLE incidents (id INTEGER PRIMARY KEY, run TEXT NOT NULL, rule TEXT NOT NULL, step INTEGER NOT NULL,"
        " status TEXT NOT NULL, body TEXT NOT NULL, quiet INTEGER NOT NULL DEFAULT 0, notified_value REAL, notified_at REAL,"
        " top_cause TEXT, thread TEXT, UNIQUE (run, rule, step));"
        "CREATE TABLE outbox (id INTEGER PRIMARY KEY, incident_id INTEGER, kind TEXT NOT NULL, payload TEXT NOT NULL,"
        " created REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, permanent INTEGER NOT NULL DEFAULT 0, sent_at REAL);"
    )
    # Layout 2 kept the scan report's form of the incident, with the source and the sink as keys.
    # (The report form names a later timeline's segment now; layout 2's did not.)
    old = {**{k: v for k, v in INC.to_report().items() if k != "segment"}, "source": "runs/exp/train.log"}
    db.execute("INSERT INTO incidents (id, run, rule, step, status, body) VALUES (1, ?, ?, ?, 'open', ?)", (INC.run, INC.rule, INC.step, json.dumps(old)))
    db.execute("INSERT INTO outbox (incident_id, kind, payload, created) VALUES (1, 'opened', ?, 1.0)", (json.dumps({"sink": "jsonl", **old}),))
    db.execute("INSERT INTO outbox (incident_id, kind, payload, created) VALUES (NULL, 'stalled', ?, 1.0)", (json.dumps({"sink": "slack", "run": "r", "step": 9, "minutes": 30.0}),))
    db.execute("PRAGMA user_version=2")
    db.commit()
    db.close()
    state = State(tmp_path / "state")
    (opened,) = state.pending(sink="jsonl")
    # What layout 2 did not keep takes its default; the rest is what was stored.
    assert opened.notice.incident.step == 700 and opened.notice.incident.segment == 0 and opened.notice.source == "runs/exp/train.log"
    assert opened.notice.incident.causes[0].confidence == 0.951  # (rounded, as the report form was)
    assert state.pending(sink="slack")[0].notice == Notice("stalled", "r", step=9, minutes=30.0)
    assert state.incident(INC.run, INC.rule, INC.step).source == "runs/exp/train.log"
    # Layout 5: an incident's opening time (Alertmanager's startsAt) is its first notification's.
    assert state.incident(INC.run, INC.rule, INC.step).opened_at == 1.0 and opened.opened_at == 1.0 and opened.created == 1.0
    assert state.db.execute("PRAGMA user_version").fetchone()[0] == VERSION
    state.close()


def test_a_stream_s_latest_value_is_kept_apart_and_an_older_state_gets_it_from_its_tail(tmp_path):
    import sqlite3

    import numpy as np

    from lossguard.state import State, StateReader, Tail

    state = State(tmp_path / "state")
    with state.transaction() as tx:
        tx.put_tail("r", "loss", Tail(np.array([1, 2], np.int64), np.array([2.0, float("nan")]), 2))
        tx.put_tail("r", "lr", Tail(np.array([1, 2], np.int64), np.array([1e-4, 2e-4]), 2))
    state.close()
    reader = StateReader(tmp_path / "state" / "state.db")
    got = reader.latest_values(["loss", "lr"])
    assert np.isnan(got[("r", "loss")]) and got[("r", "lr")] == 2e-4  # NaN kept (a REAL column would not)
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    db.execute("DELETE FROM latest WHERE metric='lr'")  # as a layout-5 file's streams are
    db.execute("ALTER TABLE runs DROP COLUMN touched")
    db.execute("PRAGMA user_version=6")
    db.commit()
    db.close()
    State(tmp_path / "state").close()  # layout 7 fills `latest` from the tails
    assert StateReader(tmp_path / "state" / "state.db").latest_values(["loss", "lr"])[("r", "lr")] == 2e-4

def test_a_layout_10_state_keeps_its_incidents_and_ids_and_then_holds_one_step_on_two_timelines(tmp_path):
    # Layout 11: a re-run's incident at a step an earlier timeline's holds is a row of its own.
    s = State(tmp_path / "state")
    with s.transaction() as tx:
        first = tx.add_incident(INC, source="a.log", quiet=False, now=1.0)
        tx.put_tails([("exp/7b", "loss", Tail(np.array([1, 2]), np.array([2.0, 2.1]), 2, 3))])
    s.close()
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    columns = [r[1] for r in db.execute("PRAGMA table_info(incidents)") if r[1] != "timeline"]
    db.execute("ALTER TABLE incidents RENAME TO new")  # as layout 10 made it: UNIQUE (run, rule, step)
    db.execute(f"CREATE TABLE incidents ({', '.join(columns)}, UNIQUE (run, rule, step))")
    db.execute(f"INSERT INTO incidents SELECT {', '.join(columns)} FROM new")
    db.execute("DROP TABLE new")
    db.execute("ALTER TABLE streams DROP COLUMN timeline")
    db.execute("PRAGMA user_version=10")
    db.commit()
    db.close()
    s = State(tmp_path / "state")
    assert s.db.execute("PRAGMA user_version").fetchone()[0] == VERSION == 13
    assert s.incident("exp/7b", "loss-spike", 700).id == first and s.tail("exp/7b", "loss").timeline == 0
    with s.transaction() as tx:
        again = tx.add_incident(replace(INC, timeline=1), source="a.log", quiet=False, now=2.0)
    assert again != first and s.incident("exp/7b", "loss-spike", 700, 0).id == first
    assert s.incident("exp/7b", "loss-spike", 700).id == again  # (the latest timeline's)
    s.close()
