"""The outbox: notifications committed with the pass that raised them and not yet delivered. The
sender reads what is pending and marks it sent or failed (each its own transaction: it runs beside
the passes); the operator lists, retries and drops entries (`lossguard outbox`, and every start
or reload retries the permanent failures)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence

from ..model import Notice
from .columns import marks
from .messages import list_in, record_alert
from .rows import OutboxEntry, Undelivered
from .transaction import Connected

_OUTBOX = (
    "SELECT o.id, o.incident_id, o.sink, o.kind, o.payload, o.attempts, o.created, i.opened_at "
    "FROM outbox o LEFT JOIN incidents i ON i.id = o.incident_id WHERE o.sent_at IS NULL AND o.permanent=0"
)


def _outbox_entry(r: tuple, state_id: str) -> OutboxEntry:
    return OutboxEntry(r[0], r[1], r[2], Notice.from_json(r[3], json.loads(r[4])), r[5], f"{state_id}-{r[0]}", r[6], r[7])


class Outbox(Connected):
    """State's reads and writes of the `outbox` table, for the sender and the operator."""

    def pending(self, limit: int = 100, *, sink: str | None = None, kind: str | None = None, after: int = 0) -> list[OutboxEntry]:
        """Undelivered entries, oldest first (permanently failed ones wait for the operator);
        `after`: only those recorded after that entry."""
        query, args = _OUTBOX + " AND o.id > ?", [after]
        if sink is not None:
            query, args = query + " AND o.sink=?", [*args, sink]
        if kind is not None:
            query, args = query + " AND o.kind=?", [*args, kind]
        return [_outbox_entry(r, self.id) for r in self.db.execute(f"{query} ORDER BY o.id LIMIT ?", (*args, limit))]

    def waiting(self, *, sink: str, kinds: Sequence[str], after: int) -> bool:
        """An undelivered entry of one of `kinds` for `sink` recorded after entry `after`: one
        indexed look, where pending would decode every payload."""
        row = self.db.execute(
            f"SELECT 1 FROM outbox WHERE sent_at IS NULL AND permanent=0 AND id > ? AND sink=? AND kind IN ({marks(kinds)}) LIMIT 1",
            (after, sink, *kinds),
        ).fetchone()
        return row is not None

    def pending_sinks(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT sink FROM outbox WHERE sent_at IS NULL AND permanent=0 ORDER BY sink")]

    # --- delivery's writes (each its own transaction: the sender runs beside the passes) ---------
    def mark_sent(self, entries: Sequence[OutboxEntry], *, now: float, thread: str | None = None, alert_in: str | None = None,
                  joins: int | None = None) -> None:
        """Delivered: never sent again. `thread`: the message their incidents' follow-ups reply to;
        `alert_in`: the sink in which that message is their incidents' own alert (posted at the top
        of a channel: the one message a resolution may rewrite); `joins`: an alert posted before
        that now announces their incidents too (an escalation's, whose header it rewrote)."""
        with self.transaction():
            # (Idempotent: a delivery journal replayed after a kill that came before it was removed
            # makes the same rows, not a second message row or attempt.)
            for e in entries:
                self.db.execute("UPDATE outbox SET sent_at=?, attempts=attempts+1 WHERE id=? AND sent_at IS NULL", (now, e.id))
                if thread and e.incident_id is not None:
                    self.db.execute("UPDATE incidents SET thread=? WHERE id=?", (thread, e.incident_id))
            if alert_in is not None and thread:
                list_in(self.db, record_alert(self.db, alert_in, thread, now=now), entries)
            if joins is not None:
                list_in(self.db, joins, entries)

    def mark_failed(self, entries: Sequence[OutboxEntry], error: str, *, permanent: bool) -> None:
        with self.transaction():
            for e in entries:
                self.db.execute("UPDATE outbox SET attempts=attempts+1, last_error=?, permanent=? WHERE id=?", (error, int(permanent), e.id))

    # --- the operator's hand on the outbox (`lossguard outbox`, and every start or reload) --------
    def undelivered(self, ids: Collection[int] | None = None) -> list[Undelivered]:
        """Entries not delivered, oldest first, with why (all, or those of `ids`)."""
        query = "SELECT id, sink, kind, payload, created, attempts, last_error, permanent FROM outbox WHERE sent_at IS NULL"
        rows = self.db.execute(f"{query} ORDER BY id").fetchall()
        wanted = None if ids is None else set(ids)
        return [
            Undelivered(r[0], r[1], r[2], json.loads(r[3]).get("run", ""), r[4], r[5], r[6], bool(r[7]))
            for r in rows if wanted is None or r[0] in wanted
        ]

    def retry(self, ids: Collection[int] | None = None) -> int:
        """Permanently failed entries (all, or those of `ids`) go back in line. The fix for such a
        failure is nearly always the operator's (a token, a channel, a URL), so the daemon retries
        them at every start and reload, and `lossguard outbox retry` at once."""
        with self.transaction():
            if ids is None:
                return self.db.execute("UPDATE outbox SET permanent=0 WHERE sent_at IS NULL AND permanent=1").rowcount
            return sum(self.db.execute("UPDATE outbox SET permanent=0 WHERE id=? AND sent_at IS NULL AND permanent=1", (i,)).rowcount for i in ids)

    def drop(self, ids: Collection[int] | None = None) -> int:
        """Entries the operator gave up on: deleted, never sent (all undelivered, or those of `ids`)."""
        with self.transaction():
            if ids is None:
                n = self.db.execute("DELETE FROM outbox WHERE sent_at IS NULL").rowcount
            else:
                n = sum(self.db.execute("DELETE FROM outbox WHERE id=? AND sent_at IS NULL", (i,)).rowcount for i in ids)
            # A picture whose alert was given up would wait for it forever.
            self.db.execute(
                "DELETE FROM plots WHERE done_at IS NULL AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.incident_id = plots.incident_id "
                "AND o.sink = plots.sink AND o.kind IN ('opened', 'escalated', 'unsilenced'))"
            )
            return n
