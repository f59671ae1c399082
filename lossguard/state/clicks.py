"""What people did from Slack (state layout 9): the Socket Mode envelopes already applied, each with
the reply it got, so an envelope Slack sends again (it was not acknowledged in time: the daemon was
killed between the commit and the ack, or the link dropped) changes nothing a second time and gets
the same answer; who acknowledged an incident; what was said on a message from Slack (`said`,
layout 10), which the daemon's own rewrites of that message keep; and how the link to Slack
stands, for `status`. A refusal stores nothing (it changed nothing: a retry decides again and
changes nothing again), so whoever clicks in the workspace cannot grow the table.

A click's change and its envelope commit in one transaction: after a kill either both are there
(the retry is answered from the row) or neither (the retry applies it)."""

from __future__ import annotations

import json

from ..silences import NewSilence, Silence
from .columns import INCIDENT, incident_row
from .rows import IncidentRow
from .silences import insert_silence
from .transaction import Connected

ENVELOPES_KEPT = 7 * 86400.0
"""Slack retries an envelope for a few minutes at most; a week of them is far more than enough
(pruned at each click, through the `envelopes_received` index)."""
Said = tuple[str, str, str]
"""(channel, ts, line): a line said on a message from Slack."""


class Clicks(Connected):
    """State's reads and writes of `envelopes`, of acknowledgements, and of the link's status."""

    def envelope_reply(self, envelope_id: str) -> str | None:
        """The reply an envelope got when it was applied (None: not applied yet)."""
        row = self.db.execute("SELECT reply FROM envelopes WHERE envelope_id=?", (envelope_id,)).fetchone()
        return None if row is None else row[0]

    def clicked_incident(self, incident_id: int) -> tuple[IncidentRow, str | None] | None:
        """The incident a button names, and who acknowledged it (None: the state holds no such incident)."""
        row = self.db.execute(f"{INCIDENT.replace(' FROM', ', acked_by FROM', 1)} WHERE id=?", (incident_id,)).fetchone()
        return None if row is None else (incident_row(row[:-1]), row[-1])

    def apply_silence(self, envelope_id: str, new: NewSilence, *, reply: str, now: float, said: Said | None = None) -> Silence | None:
        """The silence a click makes, with its envelope and the line its message says from now on
        (None: the envelope was applied already)."""
        with self.transaction():
            if not self._claim(envelope_id, reply, now):
                return None
            ident = insert_silence(self.db, new)
            self._say(said, now)
        return self.silence(ident)

    def acknowledge(self, envelope_id: str, incident_id: int, *, by: str, reply: str, now: float, said: Said | None = None) -> bool:
        """The incident taken by `by`: its updates are no longer posted (False: applied already)."""
        with self.transaction():
            if not self._claim(envelope_id, reply, now):
                return False
            self.db.execute("UPDATE incidents SET acked_by=?, acked_at=? WHERE id=? AND acked_by IS NULL", (by, now, incident_id))
            self._say(said, now)
        return True

    def said(self, thread: str) -> list[str]:
        """What was said from Slack on the message at `thread` (`channel|ts`), oldest first."""
        channel, _, ts = thread.partition("|")
        return [r[0] for r in self.db.execute("SELECT line FROM said WHERE channel=? AND ts=? ORDER BY at, rowid", (channel, ts))]

    def _say(self, said: Said | None, now: float) -> None:
        if said is not None:
            self.db.execute("INSERT OR IGNORE INTO said (channel, ts, line, at) VALUES (?,?,?,?)", (*said, now))

    def answered(self, envelope_id: str, *, reply: str, now: float) -> None:
        """An envelope that changed nothing in the state but did something once (a plot asked for):
        its retry gets the same reply, and does not do it again."""
        with self.transaction():
            self._claim(envelope_id, reply, now)

    def acked(self, incident_ids: list[int]) -> dict[int, str]:
        """incident -> who acknowledged it, of those given."""
        if not incident_ids:
            return {}
        marks = ",".join("?" * len(incident_ids))
        rows = self.db.execute(f"SELECT id, acked_by FROM incidents WHERE acked_by IS NOT NULL AND id IN ({marks})", incident_ids)
        return dict(rows.fetchall())

    def _claim(self, envelope_id: str, reply: str, now: float) -> bool:
        self.db.execute("DELETE FROM envelopes WHERE received < ?", (now - ENVELOPES_KEPT,))
        cur = self.db.execute("INSERT OR IGNORE INTO envelopes (envelope_id, received, reply) VALUES (?,?,?)", (envelope_id, now, reply))
        return cur.rowcount == 1

    def set_link(self, status: dict[str, object]) -> None:
        """How the Socket Mode link stands (connected, retrying, refused and why), for `status`."""
        with self.transaction():
            self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('slack_link', ?)", (json.dumps(status),))
