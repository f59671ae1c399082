"""What the state keeps of clicks from Slack (layout 9): an envelope applied once whatever retries
come, with the silence it made in the same commit; who acknowledged an incident; a silence "until
it recovers" ended by the recovery; and a layout-8 file brought up to it."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import replace

from lossguard.silences import new_silence
from lossguard.state import VERSION, State

from .test_pipeline import BASE, raise_


def _new(now: float, **kw):
    return new_silence(run="exp", ends=now + 3600, now=now, comment="from Slack", author="@ana", **kw)


def test_an_envelope_applied_once_makes_one_silence_whichever_connection_sees_it_again(tmp_path):
    state = State(tmp_path / "state")
    other = state.secondary()
    now = time.time()
    assert state.apply_silence("e-1", _new(now), reply="r1", now=now) is not None
    assert other.apply_silence("e-1", _new(now), reply="r2", now=now) is None  # a retry, after a restart
    assert len(state.silences()) == 1 and other.envelope_reply("e-1") == "r1"
    other.close()
    state.close()


def test_a_silence_until_it_recovers_ends_when_its_incident_is_over(tmp_path):
    state = State(tmp_path / "state")
    raise_(state, BASE)
    ident = state.incident(BASE.run, BASE.rule, BASE.step).id
    now = time.time()
    state.apply_silence("e-2", _new(now, recovers=ident), reply="", now=now)
    state.end_silences(now + 1)
    assert len(state.silences(now=now + 1)) == 1  # still open: still held
    with state.transaction() as tx:
        tx.update_incident(replace(state.incident(BASE.run, BASE.rule, BASE.step), status="resolved", incident=replace(BASE, end_step=30)))
    state.end_silences(now + 2)
    assert state.silences(now=now + 2) == [] and state.silences()[0].expired == now + 2
    state.close()


def test_an_acknowledgement_names_who_took_it_once(tmp_path):
    state = State(tmp_path / "state")
    raise_(state, BASE)
    ident = state.incident(BASE.run, BASE.rule, BASE.step).id
    assert state.acknowledge("e-3", ident, by="@ana", reply="", now=1.0)
    assert not state.acknowledge("e-3", ident, by="@ana", reply="", now=2.0)
    assert state.acked([ident]) == {ident: "@ana"} and state.clicked_incident(ident)[1] == "@ana"
    state.close()


def test_a_layout_8_state_gains_the_envelopes_acks_and_silences_until_recovery(tmp_path):
    state = State(tmp_path / "state")
    raise_(state, BASE)
    state.add_silence(run="exp", rule=None, metric=None, cause=None, starts=1.0, ends=2e9, comment="c", author="a")
    state.close()
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    db.execute("DROP TABLE envelopes")
    for table, column in (("incidents", "acked_by"), ("incidents", "acked_at"), ("silences", "recovers")):
        db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    db.execute("PRAGMA user_version=8")
    db.commit()
    db.close()
    state = State(tmp_path / "state")
    assert state.db.execute("PRAGMA user_version").fetchone()[0] == VERSION == 13
    assert state.silences()[0].recovers is None and state.envelope_reply("nope") is None
    assert state.acknowledge("e-4", 1, by="@ana", reply="", now=1.0) and state.acked([1]) == {1: "@ana"}
    state.close()


def test_a_layout_9_state_gains_the_envelopes_index_and_what_was_said_on_a_message(tmp_path):
    state = State(tmp_path / "state")
    state.apply_silence("e-5", _new(1.0), reply="r", now=1.0)
    state.close()
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    db.execute("DROP TABLE said")
    db.execute("DROP INDEX envelopes_received")
    db.execute("PRAGMA user_version=9")
    db.commit()
    db.close()
    state = State(tmp_path / "state")
    assert state.db.execute("PRAGMA user_version").fetchone()[0] == VERSION and state.envelope_reply("e-5") == "r"
    assert state.acknowledge("e-6", 1, by="@ana", reply="", now=2.0, said=("C0", "1.1", "acknowledged by @ana"))
    assert state.said("C0|1.1") == ["acknowledged by @ana"] and state.said("C0|1.2") == []
    state.close()


def test_old_envelopes_are_pruned_through_an_index_not_a_walk_of_the_table(tmp_path):
    state = State(tmp_path / "state")
    plan = state.db.execute("EXPLAIN QUERY PLAN DELETE FROM envelopes WHERE received < ?", (1.0,)).fetchall()
    assert "envelopes_received" in " ".join(str(step[-1]) for step in plan)
    state.apply_silence("e-old", _new(1.0), reply="r", now=1.0)
    state.apply_silence("e-new", _new(1.0), reply="r", now=1.0 + 8 * 86400)
    assert state.envelope_reply("e-old") is None and state.envelope_reply("e-new") == "r"
    state.close()


def test_what_was_said_on_a_message_commits_with_the_click_and_a_retry_says_it_once(tmp_path):
    state = State(tmp_path / "state")
    said = ("C0", "1.1", "silenced 4 h by @ana")
    assert state.apply_silence("e-7", _new(1.0), reply="r", now=1.0, said=said) is not None
    assert state.apply_silence("e-7", _new(1.0), reply="r", now=2.0, said=said) is None
    assert state.said("C0|1.1") == ["silenced 4 h by @ana"]
    state.close()


def test_status_reads_a_layout_8_state_as_it_is_and_leaves_it_so(tmp_path, capsys):
    from lossguard.cli import main

    state = State(tmp_path / "state")
    raise_(state, BASE)
    state.add_silence(run="exp", rule=None, metric=None, cause=None, starts=1.0, ends=2e9, comment="restarting", author="a")
    state.close()
    path = tmp_path / "state" / "state.db"
    db = sqlite3.connect(path)
    db.execute("DROP TABLE envelopes")
    db.execute("DROP TABLE IF EXISTS said")
    for table, column in (("incidents", "acked_by"), ("incidents", "acked_at"), ("silences", "recovers")):
        db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    db.execute("PRAGMA user_version=8")
    db.commit()
    db.close()
    before = path.read_bytes()
    assert main(["status", "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out
    assert "1 silence(s) in force" in out and "restarting" in out and "1 open incident(s)" in out
    assert main(["status", "--format", "json", "--state-dir", str(tmp_path / "state")]) == 0
    assert json.loads(capsys.readouterr().out)["silences"][0]["recovers"] is None
    assert path.read_bytes() == before  # read, never migrated
