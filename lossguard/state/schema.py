"""The layout of state.db: the tables (SCHEMA), the number of the layout (VERSION, kept in SQLite's
user_version) and the steps that bring a file of an older layout up to it (MIGRATIONS). Opening a
state lays it out here, so a layout change is one edit to this module."""

from __future__ import annotations

import sqlite3

INCIDENTS = """
CREATE TABLE IF NOT EXISTS incidents (
    id INTEGER PRIMARY KEY, run TEXT NOT NULL, rule TEXT NOT NULL, step INTEGER NOT NULL,
    status TEXT NOT NULL, body TEXT NOT NULL, quiet INTEGER NOT NULL DEFAULT 0,
    notified_value REAL, notified_at REAL, top_cause TEXT, thread TEXT, source TEXT NOT NULL DEFAULT '', parent INTEGER,
    opened_at REAL, acked_by TEXT, acked_at REAL, timeline INTEGER NOT NULL DEFAULT 0, folded INTEGER NOT NULL DEFAULT 0,
    joined INTEGER,
    UNIQUE (run, rule, step, timeline)
);
"""
"""The incidents table, apart: layout 11 makes it again (a new UNIQUE)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY, run TEXT NOT NULL, format TEXT, device INTEGER, inode INTEGER,
    fingerprint BLOB, cursor TEXT NOT NULL, dead INTEGER NOT NULL DEFAULT 0, quiet INTEGER NOT NULL DEFAULT 0,
    mtime INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS streams (
    run TEXT NOT NULL, metric TEXT NOT NULL, tail BLOB NOT NULL, seen INTEGER NOT NULL, timeline INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run, metric)
);
CREATE TABLE IF NOT EXISTS latest (
    run TEXT NOT NULL, metric TEXT NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (run, metric)
);
CREATE TABLE IF NOT EXISTS runs (
    run TEXT PRIMARY KEY, last_step INTEGER, advanced_at REAL, stalled INTEGER NOT NULL DEFAULT 0,
    touched INTEGER NOT NULL DEFAULT 0
);
""" + INCIDENTS + """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY, incident_id INTEGER, sink TEXT NOT NULL DEFAULT '', kind TEXT NOT NULL, payload TEXT NOT NULL,
    created REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, permanent INTEGER NOT NULL DEFAULT 0,
    sent_at REAL, silenced INTEGER
);
CREATE TABLE IF NOT EXISTS silences (
    id INTEGER PRIMARY KEY, run TEXT NOT NULL, rule TEXT, metric TEXT, cause TEXT, starts REAL NOT NULL, ends REAL NOT NULL,
    comment TEXT NOT NULL DEFAULT '', author TEXT NOT NULL DEFAULT '', created REAL NOT NULL, expired REAL, reported REAL,
    recovers INTEGER
);
CREATE TABLE IF NOT EXISTS plots (
    incident_id INTEGER NOT NULL, sink TEXT NOT NULL, picture TEXT NOT NULL, created REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, done_at REAL, error TEXT,
    PRIMARY KEY (incident_id, sink)
);
CREATE INDEX IF NOT EXISTS outbox_incident ON outbox (incident_id);
CREATE INDEX IF NOT EXISTS silences_unreported ON silences (ends) WHERE reported IS NULL;
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY, sink TEXT NOT NULL, role TEXT NOT NULL, channel TEXT, ts TEXT, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS message_incidents (
    message INTEGER NOT NULL, incident_id INTEGER NOT NULL, PRIMARY KEY (message, incident_id)
);
CREATE INDEX IF NOT EXISTS message_incidents_incident ON message_incidents (incident_id);
CREATE INDEX IF NOT EXISTS messages_in_doubt ON messages (sink) WHERE ts IS NULL;
CREATE TABLE IF NOT EXISTS envelopes (
    envelope_id TEXT PRIMARY KEY, received REAL NOT NULL, reply TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS envelopes_received ON envelopes (received);
CREATE TABLE IF NOT EXISTS said (
    channel TEXT NOT NULL, ts TEXT NOT NULL, line TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (channel, ts, line)
);
CREATE TABLE IF NOT EXISTS noisy (
    run TEXT NOT NULL, rule TEXT NOT NULL, noticed_at REAL NOT NULL, PRIMARY KEY (run, rule)
);
"""


VERSION = 13
"""The layout of state.db, kept in SQLite's user_version. A later layout adds a step to MIGRATIONS
(the statements that take version N - 1 to N), run in one transaction when an older file is opened.
Version 0 is a file from before versions were kept: its layout is version 1's. Version 2 writes
stream tails as packed numbers (TAIL_FORMAT) instead of JSON; version 1's JSON tails are still read.
Version 3 gives an outbox entry its sink and an incident its source as columns (they were keys in
the JSON), and stores incidents and notices losslessly (model.Incident.to_json); the older JSON is
still read. Version 4 links an incident to the one it escalates (`parent`: a loss spike following a
grad-norm spike), whose alert thread it shares. Version 5 keeps when an incident was raised
(`opened_at`: Alertmanager's startsAt, which every re-send must repeat); older incidents take the
time of their first outbox entry. Version 6 keeps each stream's latest value in a small table of
its own (`latest`), so a metrics scrape does not read every tail. Version 7 keeps the operator's
silences (`silences`) and marks the outbox entries a silence held back (`outbox.silenced`: its id),
which are reported when the silence ends if their incident is still open; keeps the picture of each
announced incident for each sink that shows it (`plots`: the curves as they were when the alert was
raised, drawn and sent after the alert) and indexes the outbox by incident (to find the alert a
picture follows); numbers the commits that change what a run's metrics show (`runs.touched`, meta
`touched`), so a scrape renders again only the runs a pass changed; and fills `latest` for streams
not written since layout 6. Version 8 keeps the messages lossguard posted in a sink with threads
(`messages`: channel and ts, whether it is an incident's own alert or a burst's summary, and
`message_incidents`: the incidents it is the alert of or lists), so a resolution rewrites the
right message after any restart; a summary's row is written before it is sent (ts empty until
Slack accepts it: a restart that finds it so knows the summary may have gone out). Alerts posted
before layout 8 are not in it (their headers are not rewritten). Version 9 takes actions from
Slack: the Socket Mode envelopes already applied (`envelopes`: Slack retries one not acknowledged
in time, and a retry must apply nothing twice), who acknowledged an incident (`incidents.acked_by`,
`acked_at`: its updates are no longer posted) and the incident whose recovery ends a silence
(`silences.recovers`). Version 10 indexes the envelopes by when they came (each click prunes the
old ones) and keeps what was said on a message from Slack (`said`: `silenced 4 h by @ana at 03:12`,
by channel and ts), so the header the daemon rewrites as the incident resolves or grows keeps it.
Version 11 names an incident by its timeline too (`incidents.timeline`, and `streams.timeline`, the
timeline each stream's tail ends on): a run rewritten from its start (a new `Live()` in a dvclive
folder) spikes at steps an earlier timeline spiked at, and those are incidents of their own; the
table is rebuilt for its new UNIQUE, its ids kept. Version 12 folds a noisy run's firings
(`incidents.folded`: recorded, not alerted, their resolution not posted: the loss's own noise,
detection.noise) and keeps the runs and rules whose `noisy` notice was sent (`noisy`), so a restart
sends it no second time. Version 13 keeps which incident of a run's rank stream is the same event
as another rank's incident recorded before it (`incidents.joined`: recorded, never said on its own;
the incident it joined names its rank). An older lossguard refuses a newer file rather than misread it."""
_KEPT = "id, run, rule, step, status, body, quiet, notified_value, notified_at, top_cause, thread, source, parent, opened_at, acked_by, acked_at"
"""The incidents' columns before layout 11, copied into the table it makes again."""
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (),
    2: (),
    3: (
        "ALTER TABLE outbox ADD COLUMN sink TEXT NOT NULL DEFAULT ''",
        "UPDATE outbox SET sink = coalesce(json_extract(payload, '$.sink'), '')",
        "ALTER TABLE incidents ADD COLUMN source TEXT NOT NULL DEFAULT ''",
        "UPDATE incidents SET source = coalesce(json_extract(body, '$.source'), '')",
    ),
    4: ("ALTER TABLE incidents ADD COLUMN parent INTEGER",),
    5: (
        "ALTER TABLE incidents ADD COLUMN opened_at REAL",
        "UPDATE incidents SET opened_at = coalesce((SELECT min(created) FROM outbox WHERE incident_id = incidents.id), notified_at) WHERE opened_at IS NULL",
    ),
    6: (),  # the `latest` table (SCHEMA creates it); filled as passes write tails
    7: (  # (and the `silences` and `plots` tables and the outbox's index, which SCHEMA creates)
        "ALTER TABLE outbox ADD COLUMN silenced INTEGER",
        "ALTER TABLE runs ADD COLUMN touched INTEGER NOT NULL DEFAULT 0",
        "INSERT OR IGNORE INTO latest (run, metric, value) SELECT run, metric, substr(tail, -8) FROM streams WHERE typeof(tail)='blob' AND length(tail) >= 16",
    ),
    8: (),  # the `messages` and `message_incidents` tables (SCHEMA creates them)
    9: (  # (and the `envelopes` table, which SCHEMA creates)
        "ALTER TABLE incidents ADD COLUMN acked_by TEXT",
        "ALTER TABLE incidents ADD COLUMN acked_at REAL",
        "ALTER TABLE silences ADD COLUMN recovers INTEGER",
    ),
    10: (),  # the envelopes' index and the `said` table (SCHEMA creates them)
    11: (
        "ALTER TABLE streams ADD COLUMN timeline INTEGER NOT NULL DEFAULT 0",
        # (SQLite cannot change a table's UNIQUE: the table is made again, its rows and ids kept.)
        "ALTER TABLE incidents RENAME TO incidents_10",
        INCIDENTS,
        f"INSERT INTO incidents ({_KEPT}) SELECT {_KEPT} FROM incidents_10",
        "DROP TABLE incidents_10",
    ),
    12: ("ALTER TABLE incidents ADD COLUMN folded INTEGER NOT NULL DEFAULT 0",),  # (and the `noisy` table, which SCHEMA creates)
    13: ("ALTER TABLE incidents ADD COLUMN joined INTEGER",),
}
"""(An ADD COLUMN whose column exists is skipped: the step may meet a file that already has it.)"""


INDEXES = """
CREATE INDEX IF NOT EXISTS incidents_joined ON incidents (joined) WHERE joined IS NOT NULL;
CREATE INDEX IF NOT EXISTS incidents_rule_step ON incidents (rule, timeline, step);
CREATE INDEX IF NOT EXISTS incidents_crashes ON incidents (run) WHERE json_extract(body, '$.error') IS NOT NULL;
"""
"""Indexes on columns a migration adds (made once the file has them: SCHEMA runs before MIGRATIONS):
what joined an incident; a rule's incidents by step and a run's crashes, which an incident of one
rank of a job looks among for the same event on another (State.rank_event)."""


def lay_out(db: sqlite3.Connection, version: int) -> None:
    """Creates the tables a file lacks, then takes a file of layout `version` to VERSION in one
    transaction (a file without tables is new: it has every column already)."""
    empty = db.execute("SELECT count(*) FROM sqlite_master WHERE type='table' AND name='files'").fetchone()[0] == 0
    db.executescript(SCHEMA)
    if version >= VERSION:
        db.executescript(INDEXES)
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        for step in range(version + 1, VERSION + 1) if not empty else ():
            for statement in MIGRATIONS[step]:
                if not _has_column(db, statement):
                    db.execute(statement)
        db.execute(f"PRAGMA user_version={VERSION}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    db.executescript(INDEXES)


def _has_column(db: sqlite3.Connection, statement: str) -> bool:
    words = statement.split()
    if words[:2] != ["ALTER", "TABLE"] or words[3:5] != ["ADD", "COLUMN"]:
        return False
    return any(row[1] == words[5] for row in db.execute(f"PRAGMA table_info({words[2]})"))
