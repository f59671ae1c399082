"""The operator's silences (state layout 7; `lossguard silence`): kept in the state so the daemon
and the commands share them, honoured by the sender at every round (what a silence covers is held
back, remembered as held by it), and when one ends, what it held that is still wrong is reported
once. Ended silences are kept SILENCES_KEPT_DAYS for `silence list --all`, then pruned."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import replace

from ..model import Notice
from ..silences import NewSilence, Silence, covering
from .columns import INCIDENT, column_or_null, incident_row
from .rows import OutboxEntry
from .transaction import Connected

_SILENCE = "SELECT id, run, rule, metric, cause, starts, ends, comment, author, created, expired, reported, recovers FROM silences"
_IN_FORCE = "reported IS NULL AND expired IS NULL AND ends > ?"
"""The silences that may hold something at `?`: the few rows of the `silences_unreported` index,
never the ended ones (a state may keep thousands: SILENCES_KEPT_DAYS)."""
_OVER = "reported IS NULL AND (expired IS NOT NULL OR ends <= ?)"
"""Silences ended and not yet reported (Silence.ended, in SQL)."""
SILENCES_KEPT_DAYS = 30
"""An ended silence, once reported, is kept this long for `silence list --all` (who silenced what,
and why, when a post-mortem asks a few weeks on), then deleted. Nothing else reads it: what it held
was reported when it ended. Alertmanager keeps expired silences for 5 days; a month covers the
review cycles of a training campaign and still bounds the table (a silence a minute from a script
is 43,200 rows, which no round reads)."""


def _silence(r: tuple) -> Silence:
    return Silence(*r)


def select_silences(db: sqlite3.Connection, *, now: float | None) -> list[Silence]:
    """Silences in force at `now` (None: every one kept), oldest first; none in a state from before
    layout 7, which had none, and none "until it recovers" before layout 9 (read, never migrated here). (Sorted here: an ORDER BY would have SQLite walk the whole table in
    id order instead of the index of the few unreported ones.)"""
    if not db.execute("SELECT count(*) FROM sqlite_master WHERE type='table' AND name='silences'").fetchone()[0]:
        return []
    query = _SILENCE.replace(", recovers ", f", {column_or_null(db, 'silences', 'recovers')} ", 1)  # (none before layout 9)
    if now is None:
        return [_silence(r) for r in db.execute(f"{query} ORDER BY id")]
    return sorted(map(_silence, db.execute(f"{query} WHERE {_IN_FORCE}", (now,))), key=lambda s: s.id)


class Silences(Connected):
    """State's reads and writes of the `silences` table and of what the silences hold back."""

    def silences(self, *, now: float | None = None) -> list[Silence]:
        """Every silence kept, oldest first; with `now`, only those in force (not ended by then,
        and not expired or reported, whatever the clock says): read through an index at every
        round, so the ended ones a state keeps cost the sender nothing."""
        return select_silences(self.db, now=now)

    def ended_silences(self, *, now: float, limit: int | None = None) -> tuple[list[Silence], int]:
        """The silences kept that are not in force at `now`: the `limit` added last (None: every
        one), oldest first, and how many are kept (`silence list --all`: the table read backwards
        from its newest row, however many it keeps)."""
        ended = f"NOT ({_IN_FORCE})"
        total = self.db.execute(f"SELECT count(*) FROM silences WHERE {ended}", (now,)).fetchone()[0]
        rows = self.db.execute(f"{_SILENCE} WHERE {ended} ORDER BY id DESC LIMIT ?", (now, -1 if limit is None else limit)).fetchall()
        return [_silence(r) for r in reversed(rows)], total

    def add_silence(self, *, run: str, rule: str | None, metric: str | None, cause: str | None, starts: float, ends: float,
                    comment: str, author: str, recovers: int | None = None) -> Silence:
        with self.transaction():
            ident = insert_silence(self.db, NewSilence(run, rule, metric, cause, starts, ends, comment, author, recovers))
        return self.silence(ident)

    def silence(self, ident: int) -> Silence:
        return _silence(self.db.execute(f"{_SILENCE} WHERE id=?", (ident,)).fetchone())

    def expire_silence(self, ident: int, *, now: float) -> Silence | None:
        """Ends a silence now (None: no such silence). One already over stays as it was."""
        with self.transaction():
            self.db.execute("UPDATE silences SET expired=? WHERE id=? AND expired IS NULL AND reported IS NULL AND ends > ?", (now, ident, now))
        row = self.db.execute(f"{_SILENCE} WHERE id=?", (ident,)).fetchone()
        return None if row is None else _silence(row)

    def announced(self, entry: OutboxEntry) -> bool:
        """Whether what `entry` follows up went out to its sink, not held by a silence: its
        incident's alert (opened, escalated, or reported as a silence ended), or for a run's notice
        the last stall said of the run before it."""
        if entry.incident_id is not None:
            return self.db.execute(
                "SELECT EXISTS (SELECT 1 FROM outbox WHERE incident_id=? AND sink=? AND kind IN ('opened', 'escalated', 'unsilenced') "
                "AND sent_at IS NOT NULL AND silenced IS NULL)", (entry.incident_id, entry.sink),
            ).fetchone()[0] == 1
        row = self.db.execute(
            "SELECT sent_at IS NOT NULL AND silenced IS NULL FROM outbox WHERE incident_id IS NULL AND sink=? AND id < ? "
            "AND kind IN ('stalled', 'unsilenced') AND json_extract(payload, '$.run')=? ORDER BY id DESC LIMIT 1",
            (entry.sink, entry.id, entry.notice.run),
        ).fetchone()
        return bool(row and row[0])

    def hold(self, entries: Sequence[OutboxEntry], silence: Silence, *, now: float) -> bool:
        """Entries a silence covers: settled without being sent, and remembered as held by it.
        False (nothing held) when the silence's end was reported meanwhile (another sink's sender,
        after this one read the silences): what it held then would never be reported."""
        with self.transaction():
            if self.db.execute("SELECT reported IS NULL FROM silences WHERE id=?", (silence.id,)).fetchone() != (1,):
                return False
            for e in entries:
                self.db.execute("UPDATE outbox SET sent_at=?, silenced=? WHERE id=? AND sent_at IS NULL", (now, silence.id, e.id))
        return True

    def end_recovered(self, now: float) -> None:
        """Silences "until it recovers" whose incident is over end now (their end is then reported
        as any other's). Looked for by the index of the unreported ones: no write lock taken when none is due."""
        due = "recovers IS NOT NULL AND reported IS NULL AND expired IS NULL AND recovers IN (SELECT id FROM incidents WHERE status != 'open')"
        if self.db.execute(f"SELECT EXISTS (SELECT 1 FROM silences WHERE {due})").fetchone()[0]:
            with self.transaction():
                self.db.execute(f"UPDATE silences SET expired=? WHERE {due}", (now,))

    def end_silences(self, now: float) -> int:
        """Silences that ended since the last look: what they held back and is still wrong (an
        incident still open, a run still stalled) is reported once, to each sink it was held from,
        unless another silence still covers it (then that one holds it). One transaction: a
        crash reports it exactly once, at the next start. Returns the notices queued."""
        queued = 0
        self.end_recovered(now)
        if not self.db.execute(f"SELECT EXISTS (SELECT 1 FROM silences WHERE {_OVER})", (now,)).fetchone()[0]:
            return 0  # (the common case, every round: no write lock taken, only the index read)
        with self.transaction() as tx:
            silences = [_silence(r) for r in self.db.execute(f"{_SILENCE} WHERE reported IS NULL").fetchall()]
            ended = [s for s in silences if s.ended(now)]
            others = [s for s in silences if s.active(now)]
            for s in ended:
                for notice, incident_id, sink in self._held_still_wrong(s):
                    other = covering(others, notice, now)
                    if other is not None:
                        self.db.execute(
                            "UPDATE outbox SET silenced=? WHERE silenced=? AND sink=? AND incident_id IS ? AND json_extract(payload, '$.run')=?",
                            (other.id, s.id, sink, incident_id, notice.run),
                        )
                        continue
                    tx.enqueue(replace(notice, silenced_by=s.describe()), incident_id=incident_id, sinks=[sink], now=now)
                    queued += 1
                # A picture whose alert the silence held, of an incident that recovered under it,
                # has no alert left to follow.
                self.db.execute(
                    "UPDATE plots SET done_at=?, error='its alert was held by a silence', picture='' WHERE done_at IS NULL AND incident_id IN "
                    "(SELECT o.incident_id FROM outbox o JOIN incidents i ON i.id = o.incident_id WHERE o.silenced=? AND i.status != 'open') "
                    "AND NOT EXISTS (SELECT 1 FROM outbox o2 WHERE o2.incident_id = plots.incident_id AND o2.sink = plots.sink "
                    "AND o2.kind IN ('opened', 'escalated', 'unsilenced') AND o2.silenced IS NULL)", (now, s.id),
                )
                self.db.execute("UPDATE silences SET reported=? WHERE id=?", (now, s.id))
            prune_silences(self.db, now)
        return queued

    def _held_still_wrong(self, silence: Silence) -> list[tuple[Notice, int | None, str]]:
        """(the notice to report, its incident, the sink) for what `silence` held back and is still
        wrong: each open incident once per sink (as it stands now), each still-stalled run once."""
        out: list[tuple[Notice, int | None, str]] = []
        rows = self.db.execute(
            "SELECT DISTINCT o.incident_id, o.sink FROM outbox o JOIN incidents i ON i.id = o.incident_id "
            "WHERE o.silenced=? AND i.status='open' ORDER BY o.incident_id, o.sink", (silence.id,)
        ).fetchall()
        for incident_id, sink in rows:
            row = incident_row(self.db.execute(f"{INCIDENT} WHERE id=?", (incident_id,)).fetchone())
            out.append((Notice("unsilenced", row.incident.run, row.incident, source=row.source), incident_id, sink))
        stalled = self.db.execute(
            "SELECT DISTINCT o.sink, r.run, r.last_step FROM outbox o JOIN runs r ON r.run = json_extract(o.payload, '$.run') "
            "WHERE o.silenced=? AND o.incident_id IS NULL AND o.kind='stalled' AND r.stalled=1 ORDER BY r.run, o.sink", (silence.id,)
        ).fetchall()
        for sink, run, step in stalled:
            out.append((Notice("unsilenced", run, step=step), None, sink))
        return out


def insert_silence(db: sqlite3.Connection, new: NewSilence) -> int:
    """A new silence's row (in the caller's transaction: a click's silence commits with its envelope)."""
    cur = db.execute(
        "INSERT INTO silences (run, rule, metric, cause, starts, ends, comment, author, created, recovers) VALUES (?,?,?,?,?,?,?,?,?,?)",
        (new.run, new.rule, new.metric, new.cause, new.starts, new.ends, new.comment, new.author, new.starts, new.recovers),
    )
    prune_silences(db, new.starts)
    return int(cur.lastrowid)


def prune_silences(db: sqlite3.Connection, now: float) -> None:
    """Silences ended and reported more than SILENCES_KEPT_DAYS ago are deleted (in the write of
    a silence added or ended: no timer of its own). The newest row always stays, so that SQLite
    never gives its id to a new silence: entries it held still name it (`outbox.silenced`)."""
    db.execute(
        "DELETE FROM silences WHERE reported IS NOT NULL AND min(ends, coalesce(expired, ends)) < ? AND id < (SELECT max(id) FROM silences)",
        (now - SILENCES_KEPT_DAYS * 86400,),
    )
