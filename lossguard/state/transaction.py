"""A pass's writes and the commit that makes them one: the Transaction every daemon row is written
through, and the connection State's parts stand on (Connected), whose `transaction()` commits a
pass's offsets, tails, incidents and outbox entries at once, or none of them."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..model import Incident, Notice
from .columns import chunks, marks, pack_tail, stored
from .errors import BUSY, StateBusy
from .rows import FileRow, IncidentRow, Tail

OWED = "history-owed:"
"""The `meta` key prefix of a root whose first complete listing is still owed (state.owed)."""
TAIL_CACHE = 512
"""Streams whose committed tails stay in memory: a busy run's pass need not decode them again."""


@dataclass
class Transaction:
    """A pass's writes, typed: the only place the daemon's rows are written."""

    db: sqlite3.Connection
    tails: dict[tuple[str, str], Tail] = field(default_factory=dict)
    dropped: set[tuple[str, str]] = field(default_factory=set)
    """Tails this transaction forgot (drop_tails): out of the cache once it commits."""
    touched: set[str] = field(default_factory=set)
    """Runs whose metrics (latest values, step, stall, incidents) this transaction changed."""

    def number_touched(self) -> None:
        """This commit's number, on every run it changed: what a scrape renders again."""
        self.db.execute("INSERT INTO meta (key, value) VALUES ('touched', 1) ON CONFLICT (key) DO UPDATE SET value = value + 1")
        for chunk in chunks(sorted(self.touched)):
            self.db.execute(f"UPDATE runs SET touched = (SELECT value FROM meta WHERE key='touched') WHERE run IN ({marks(chunk)})", chunk)

    def put_file(self, f: FileRow) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO files (path, run, format, device, inode, fingerprint, cursor, dead, quiet, mtime) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (stored(f.path), f.run, f.format, f.device, f.inode, f.fingerprint, f.cursor, int(f.dead), int(f.quiet), f.mtime),
        )

    def forget_file(self, path: str) -> None:
        self.db.execute("DELETE FROM files WHERE path=?", (stored(path),))

    def put_tail(self, run: str, key: str, tail: Tail) -> None:
        packed = pack_tail(tail)
        self.db.execute("INSERT OR REPLACE INTO streams (run, metric, tail, seen, timeline) VALUES (?,?,?,?,?)", (run, key, packed, tail.seen, tail.timeline))
        if tail.values.size:  # the latest value on its own: a scrape reads it without the tail
            self.db.execute("INSERT OR REPLACE INTO latest (run, metric, value) VALUES (?,?,?)", (run, key, packed[-8:]))
            self.touched.add(run)
        self.tails[(run, key)] = tail

    def drop_tails(self, keys: Sequence[tuple[str, str]]) -> None:
        """Forget the (run, key) tails named: what a stream no longer needs (a loss's parts kept for
        a run whose own loss is read)."""
        if keys:
            self.db.executemany("DELETE FROM streams WHERE run=? AND metric=?", keys)
            self.db.executemany("DELETE FROM latest WHERE run=? AND metric=?", keys)
            for key in keys:
                self.tails.pop(key, None)
                self.dropped.add(key)

    def put_tails(self, tails: Sequence[tuple[str, str, Tail]]) -> None:
        """`put_tail` of many streams, in two statements (a pass over hundreds of busy runs)."""
        rows, latest = [], []
        for run, key, tail in tails:
            packed = pack_tail(tail)
            rows.append((run, key, packed, tail.seen, tail.timeline))
            if tail.values.size:
                latest.append((run, key, packed[-8:]))
                self.touched.add(run)
            self.tails[(run, key)] = tail
        self.db.executemany("INSERT OR REPLACE INTO streams (run, metric, tail, seen, timeline) VALUES (?,?,?,?,?)", rows)
        self.db.executemany("INSERT OR REPLACE INTO latest (run, metric, value) VALUES (?,?,?)", latest)

    def advance_runs(self, runs: Sequence[tuple[str, int]], *, now: float) -> None:
        """`advance_run` of many runs (run, last step) in one statement."""
        self.db.executemany("INSERT OR REPLACE INTO runs (run, last_step, advanced_at, stalled) VALUES (?,?,?,0)", [(run, step, now) for run, step in runs])
        self.touched.update(run for run, _ in runs)

    def add_incident(self, incident: Incident, *, source: str, quiet: bool, now: float, parent: int | None = None, folded: bool = False,
                     joined: int | None = None) -> int:
        """`parent`: the incident this one escalates (its alert thread is this one's too); `folded`:
        into its run's noisy notice, not alerted (detection.noise); `joined`: another rank's incident
        of the same event, which says it (detection.ranks)."""
        status = "resolved" if incident.over else "open"
        top = incident.causes[0].cause if incident.causes else None
        cur = self.db.execute(
            "INSERT INTO incidents (run, rule, step, timeline, status, body, source, quiet, notified_value, notified_at, top_cause, parent, opened_at, folded, joined) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (incident.run, incident.rule, incident.step, incident.timeline, status, json.dumps(incident.to_json()), source, int(quiet), incident.value, now,
             top, parent, now, int(folded), joined),
        )
        self.touched.add(incident.run)
        return int(cur.lastrowid)

    def update_incident(self, row: IncidentRow) -> None:
        """The incident as now judged, and what was last announced about it."""
        status = "resolved" if row.incident.over else "open"
        top = row.incident.causes[0].cause if row.incident.causes else None
        self.db.execute(
            "UPDATE incidents SET status=?, body=?, source=?, top_cause=?, notified_value=?, notified_at=? WHERE id=?",
            (status, json.dumps(row.incident.to_json()), row.source, top, row.notified_value, row.notified_at, row.id),
        )
        self.touched.add(row.incident.run)

    def unfold(self, incident_id: int) -> None:
        """A folded incident grew outside its run's noise: alerted from now on, as any other."""
        self.db.execute("UPDATE incidents SET folded=0 WHERE id=?", (incident_id,))

    def note_noisy(self, run: str, rule: str, *, now: float) -> bool:
        """The run's noisy notice for `rule` is sent now: False if it was already (one per run and rule)."""
        return self.db.execute("INSERT OR IGNORE INTO noisy (run, rule, noticed_at) VALUES (?,?,?)", (run, rule, now)).rowcount == 1

    def enqueue(self, notice: Notice, *, incident_id: int | None, sinks: Sequence[str], now: float) -> None:
        payload = json.dumps(notice.to_json())
        for sink in sinks:
            self.db.execute(
                "INSERT INTO outbox (incident_id, sink, kind, payload, created) VALUES (?,?,?,?,?)", (incident_id, sink, notice.kind, payload, now)
            )

    def add_plot(self, incident_id: int, picture: str, *, sinks: Sequence[str], now: float) -> None:
        """The incident's picture, to show in `sinks` once its alert went out there."""
        for sink in sinks:
            self.db.execute(
                "INSERT OR IGNORE INTO plots (incident_id, sink, picture, created) VALUES (?,?,?,?)", (incident_id, sink, picture, now)
            )

    def advance_run(self, run: str, last_step: int, *, now: float) -> None:
        self.db.execute("INSERT OR REPLACE INTO runs (run, last_step, advanced_at, stalled) VALUES (?,?,?,0)", (run, last_step, now))
        self.touched.add(run)

    def mark_stalled(self, run: str) -> None:
        self.db.execute("UPDATE runs SET stalled=1 WHERE run=?", (run,))
        self.touched.add(run)

    def settle(self) -> None:
        """The first pass commits: from now on what the logs hold beyond their offsets is news."""
        self.db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('settled', ?)", (repr(time.time()),))

    def owe_history(self, roots: Sequence[str]) -> None:
        """Roots the first start could not read whole: what they hold when first read is history."""
        self.db.executemany("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", [(OWED + r, repr(time.time())) for r in roots])

    def history_read(self, roots: Sequence[str]) -> None:
        """The roots' history was read (quietly), in the pass this commits: what comes next is news."""
        self.db.executemany("DELETE FROM meta WHERE key=?", [(OWED + r,) for r in roots])


class Connected:
    """What each part of State stands on: the connection, the state's id (in every outbox key), the
    committed tails kept in memory, and the one way to write (`transaction`)."""

    db: sqlite3.Connection
    path: Path
    id: str
    _tails: OrderedDict[tuple[str, str], Tail]

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """All of a pass's writes, committed at once; the tails it wrote join the cache only then.
        A write lock another writer holds for longer than this connection waits is StateBusy."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in BUSY:
                raise StateBusy(f"{self.path}: the state is locked by another writer ({exc})") from None
            raise
        tx = Transaction(self.db)
        try:
            yield tx
            if tx.touched:
                tx.number_touched()
        except BaseException:
            self.db.execute("ROLLBACK")
            self._tails.clear()
            raise
        self.db.execute("COMMIT")
        for key in tx.dropped:
            self._tails.pop(key, None)
        for key, tail in tx.tails.items():
            self._tails[key] = tail
            self._tails.move_to_end(key)
        while len(self._tails) > TAIL_CACHE:
            self._tails.popitem(last=False)
