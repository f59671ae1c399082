"""Where lossguard's alerts were posted in a sink with threads (state layout 8): each incident's
thread, and the messages (an incident's own alert, a burst's summary) with the incidents each
announces or lists, so a resolution rewrites the right message after any restart, and a summary
whose post a restart interrupted is known to be in doubt."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from .columns import INCIDENT, incident_row
from .rows import OutboxEntry, Posted
from .transaction import Connected


def record_alert(db: sqlite3.Connection, sink: str, thread: str, *, now: float) -> int:
    """The row of the alert posted at `thread` (`channel|ts`) in `sink`: the one kept, else a new
    one (a delivery journal replayed after a kill makes no second row)."""
    channel, _, ts = thread.partition("|")
    known = db.execute("SELECT id FROM messages WHERE sink=? AND channel=? AND ts=? AND role='alert'", (sink, channel, ts)).fetchone()
    if known:
        return known[0]
    return db.execute("INSERT INTO messages (sink, role, channel, ts, created) VALUES (?, 'alert', ?, ?, ?)", (sink, channel, ts, now)).lastrowid


def list_in(db: sqlite3.Connection, message: int, entries: Sequence[OutboxEntry]) -> None:
    """The entries' incidents join what `message` announces or lists (once each)."""
    db.executemany(
        "INSERT OR IGNORE INTO message_incidents (message, incident_id) VALUES (?,?)",
        [(message, e.incident_id) for e in entries if e.incident_id is not None],
    )


class Messages(Connected):
    """State's reads and writes of incidents' threads and of the `messages` tables."""

    def thread(self, incident_id: int) -> str | None:
        """The Slack message the incident's notices reply to: its own, else (an escalation not yet
        posted) the thread of the incident it escalates."""
        row = self.db.execute(
            "SELECT coalesce(i.thread, p.thread) FROM incidents i LEFT JOIN incidents p ON p.id = i.parent WHERE i.id=?", (incident_id,)
        ).fetchone()
        return row[0] if row else None

    def alert_message(self, incident_id: int, sink: str) -> Posted | None:
        """The incident's own alert in `sink` (or, an escalation, the alert of the incident it
        escalates), with every incident it announces: those it was posted for and the escalations
        that joined it."""
        row = self.db.execute(
            "SELECT m.id, m.role, m.channel, m.ts FROM messages m JOIN message_incidents mi ON mi.message = m.id "
            "WHERE m.sink=? AND m.role='alert' AND mi.incident_id IN (SELECT id FROM incidents WHERE id=? UNION SELECT parent FROM incidents WHERE id=?) "
            "ORDER BY m.id LIMIT 1", (sink, incident_id, incident_id),
        ).fetchone()
        return None if row is None else self._posted(row)

    def summary_of(self, incident_id: int, sink: str) -> Posted | None:
        """The burst summary in `sink` that lists the incident (posted: its ts known)."""
        row = self.db.execute(
            "SELECT m.id, m.role, m.channel, m.ts FROM messages m JOIN message_incidents mi ON mi.message = m.id "
            "WHERE m.sink=? AND m.role IN ('summary', 'repeat') AND m.ts IS NOT NULL AND mi.incident_id=? ORDER BY m.id DESC LIMIT 1",
            (sink, incident_id),
        ).fetchone()
        return None if row is None else self._posted(row)

    def summaries_in_doubt(self, sink: str) -> dict[int, int]:
        """incident -> the summary listing it whose post a restart interrupted (no ts recorded)."""
        rows = self.db.execute(
            "SELECT mi.incident_id, m.id FROM messages m JOIN message_incidents mi ON mi.message = m.id WHERE m.sink=? AND m.ts IS NULL", (sink,)
        )
        return dict(rows.fetchall())

    def _posted(self, row: tuple) -> Posted:
        query = f"{INCIDENT} WHERE id IN (SELECT incident_id FROM message_incidents WHERE message=?) ORDER BY id"
        incidents = tuple(incident_row(r) for r in self.db.execute(query, (row[0],)))
        return Posted(row[0], row[1], f"{row[2]}|{row[3]}" if row[3] else None, incidents)

    def set_thread(self, entries: Sequence[OutboxEntry], thread: str, *, message: int | None = None, repeat: bool = False) -> None:
        """The message the entries' incidents reply in (a summary listing them), before they are
        sent. `message`: the summary's row (`intend_summary`), whose channel and ts are known now;
        `repeat`: the post was the short one that stands for a summary in doubt."""
        with self.transaction():
            for e in entries:
                if e.incident_id is not None:
                    self.db.execute("UPDATE incidents SET thread=? WHERE id=?", (thread, e.incident_id))
            if message is not None:
                channel, _, ts = thread.partition("|")
                role = "repeat" if repeat else "summary"
                self.db.execute("UPDATE messages SET channel=?, ts=?, role=? WHERE id=?", (channel, ts, role, message))

    def intend_summary(self, sink: str, entries: Sequence[OutboxEntry], *, now: float) -> int:
        """A burst's summary about to be sent to `sink`, listing the entries' incidents: written
        before the post, so a restart that finds it without a ts knows it may have gone out."""
        with self.transaction():
            message = int(self.db.execute("INSERT INTO messages (sink, role, created) VALUES (?, 'summary', ?)", (sink, now)).lastrowid)
            list_in(self.db, message, entries)
        return message

    def forget_message(self, message: int) -> None:
        """A summary whose post was refused: it did not go out."""
        with self.transaction():
            self.db.execute("DELETE FROM message_incidents WHERE message=?", (message,))
            self.db.execute("DELETE FROM messages WHERE id=?", (message,))
